"""deepinfer_cache: see docs/cache.md.

Example::

    import deepinfer_cache
    print(deepinfer_cache.__version__)
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
