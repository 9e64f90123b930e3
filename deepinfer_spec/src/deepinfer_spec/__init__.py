"""deepinfer_spec: see docs/spec.md.

Example::

    import deepinfer_spec
    print(deepinfer_spec.__version__)
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
