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

# Where each known array library keeps the ``from_dlpack`` that answers in its own kind. JAX
# arrays report their type as ``jaxlib...``; the importer lives in ``jax.numpy``. Any other
# library is asked for a top-level ``from_dlpack`` (the array-API standard place).
_IMPORTERS = {
    "numpy": "numpy",
    "cupy": "cupy",
    "jax": "jax.numpy",
    "jaxlib": "jax.numpy",
}


def _kind(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


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
        try:
            return torch.utils.dlpack.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise TypeError(
                f"{name}: a {_kind(x)} array could not be shared through DLPack ({exc})"
            ) from exc
    raise TypeError(f"{name}: expected a torch.Tensor or a DLPack-capable array, got {type(x)!r}")


def _from_dlpack_for(x: Any) -> Callable[[Any], Any] | None:
    """The caller's library's ``from_dlpack``, or ``None`` when it has none."""
    root = type(x).__module__.split(".")[0]
    try:
        module = importlib.import_module(_IMPORTERS.get(root, root))
    except ImportError:
        return None
    fn = getattr(module, "from_dlpack", None)
    return fn if callable(fn) else None


def result_converter(*inputs: Any) -> Callable[[torch.Tensor], Any]:
    """A function mapping torch results back to the array kind of the first non-torch input.

    When every input is a torch tensor (or None) it is the identity. An array whose library
    offers no ``from_dlpack`` cannot be answered in kind: rather than silently returning torch
    tensors, this raises ``TypeError`` before any work is done.
    """
    for position, x in enumerate(inputs):
        if x is None or isinstance(x, torch.Tensor) or not hasattr(x, "__dlpack__"):
            continue
        from_dlpack = _from_dlpack_for(x)
        if from_dlpack is None:
            raise TypeError(
                f"input {position}: {_kind(x)} arrays cannot be returned in kind (their "
                "library has no from_dlpack); pass torch tensors, or NumPy, CuPy or JAX arrays"
            )
        return lambda t: from_dlpack(t.detach())
    return lambda t: t
