"""Helpers for the compiled CPU kernel tests."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from deepinfer_kernels.cpu import compiler_available

K = TypeVar("K")


def built(kernel: K) -> K:
    """``kernel`` (a compiled CPU kernel handle) once built. Skips the test on a machine without
    a C compiler; on one with a compiler a failed build fails the test (it is a bug there)."""
    if not compiler_available():
        pytest.skip("no C compiler on this machine")
    handle: Any = kernel
    ok = handle.available()
    assert ok, getattr(handle, "error", None) or getattr(getattr(handle, "fn", None), "error", None)
    return kernel
