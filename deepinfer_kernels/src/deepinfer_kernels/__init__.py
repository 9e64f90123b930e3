"""deepinfer_kernels: see docs/kernels.md.

Example::

    import deepinfer_kernels
    print(deepinfer_kernels.__version__)
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
