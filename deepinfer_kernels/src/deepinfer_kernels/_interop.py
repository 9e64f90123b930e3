"""DLPack interop: accept any DLPack-capable array (CuPy, JAX, NumPy...) and answer in kind.

Conversion never copies: ``torch.from_dlpack`` shares the buffer, and results go back through
the caller's own ``from_dlpack``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, overload

import torch
import torch.utils.dlpack


@overload
def to_torch(x: None, name: str) -> None: ...
@overload
def to_torch(x: torch.Tensor | Any, name: str) -> torch.Tensor: ...
def to_torch(x: Any, name: str) -> torch.Tensor | None:
    """Return ``x`` as a torch tensor sharing memory (``None`` stays ``None``); ``name`` is
    used in errors."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "__dlpack__"):
        return torch.utils.dlpack.from_dlpack(x)
    raise TypeError(f"{name}: expected a torch.Tensor or a DLPack-capable array, got {type(x)!r}")


def result_converter(*inputs: Any) -> Callable[[torch.Tensor], Any]:
    """A function mapping torch results back to the array kind of the first non-torch input.

    When every input is a torch tensor (or None) it is the identity.
    """
    for x in inputs:
        if x is None or isinstance(x, torch.Tensor) or not hasattr(x, "__dlpack__"):
            continue
        module_name = type(x).__module__.split(".")[0]
        module = importlib.import_module(module_name)
        from_dlpack = getattr(module, "from_dlpack", None)
        if from_dlpack is None:
            break
        return lambda t: from_dlpack(t.detach())
    return lambda t: t
