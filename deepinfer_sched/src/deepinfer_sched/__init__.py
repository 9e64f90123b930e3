"""deepinfer_sched: see docs/sched.md.

Example::

    import deepinfer_sched
    print(deepinfer_sched.__version__)
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
