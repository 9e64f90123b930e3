"""Choosing between the Triton kernels and the torch path.

CUDA tensors run Triton. CPU tensors run the torch path, unless the caller passes
``use_triton=True`` or sets ``DEEPINFER_FORCE_TRITON=1``; tests do that together with
``TRITON_INTERPRET=1`` so the kernels run under the Triton interpreter on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

FORCE_TRITON_ENV = "DEEPINFER_FORCE_TRITON"


def triton_available() -> bool:
    """True when triton imports (it is absent on some platforms)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def should_use_triton(device: torch.device, use_triton: bool | None = None) -> bool:
    """Decide the path for tensors on ``device``.

    ``use_triton`` overrides the default; ``None`` means: Triton on CUDA, torch elsewhere,
    unless ``DEEPINFER_FORCE_TRITON=1``. Forcing Triton on CPU requires the interpreter.
    """
    if use_triton is None:
        use_triton = device.type == "cuda" or os.environ.get(FORCE_TRITON_ENV, "0") == "1"
    if not use_triton:
        return False
    if not triton_available():
        raise RuntimeError("use_triton: triton is not installed")
    if device.type != "cuda" and not interpreter_active():
        raise RuntimeError(
            "use_triton: Triton on a non-CUDA device needs TRITON_INTERPRET=1 set before import"
        )
    return True


def eager_or_op(op: Callable[..., T], impl: Callable[..., T]) -> Callable[..., T]:
    """``impl`` (the op's body) when running eagerly, the registered custom ``op`` while
    ``torch.compile`` traces.

    Calling a ``torch.library`` op eagerly costs a dispatcher round trip per call and, on the
    first call in a process, about two seconds of importing torch's compiler stack; eager callers
    need neither. The op exists for tracing, where its fake gives the compiler the shapes.
    """
    return op if torch.compiler.is_compiling() else impl
