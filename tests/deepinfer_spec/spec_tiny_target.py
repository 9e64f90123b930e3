"""The tiny target now lives in ``deepinfer_spec.testing``; this name stays importable for the
CLI tests that pass ``--target spec_tiny_target:make_target``."""

from deepinfer_spec.testing import TinyTarget, make_target

__all__ = ["TinyTarget", "make_target"]
