"""deepinfer: the thin integration layer that assembles the DeepInfer components into an engine.

Example::

    import deepinfer
    print(deepinfer.__version__)
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
