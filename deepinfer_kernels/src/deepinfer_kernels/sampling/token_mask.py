"""``apply_token_bitmask``: structured-output token masks on a batch of logits (public op).

The mask is the packed int32 layout that llguidance and xgrammar fill (token ``i`` allowed when
bit ``i % 32`` of word ``i // 32`` is set), so a grammar engine writes straight into it.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op
from deepinfer_kernels._interop import result_converter, to_torch


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[B, V]`` bool: True where the packed ``bitmask`` ``[B, W]`` allows the token."""
    # An arithmetic shift keeps bit b in place at position 0 (the sign bit 31 included).
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1) != 0
    return allowed.reshape(bitmask.shape[0], -1)[:, :vocab]


def _apply_token_bitmask_impl(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    allowed = unpack_bitmask(bitmask, logits.shape[1])
    return torch.where(allowed, logits.to(torch.float32), float("-inf"))


_apply_token_bitmask_op = torch.library.custom_op(
    "deepinfer::apply_token_bitmask", _apply_token_bitmask_impl, mutates_args=()
)


@_apply_token_bitmask_op.register_fake
def _(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


def apply_token_bitmask(logits: Any, bitmask: Any) -> Any:
    """Float32 copy of ``logits`` ``[B, V]`` with disallowed tokens set to ``-inf``.

    ``bitmask`` is int32 ``[B, W]`` with ``32 * W >= V`` (words past the vocabulary are
    ignored). A row with no allowed token comes back all ``-inf``; ``sample`` refuses it, so a
    grammar dead end never turns into an arbitrary token.

    Example::

        masked = apply_token_bitmask(logits, bitmask)  # bitmask from llguidance / xgrammar
    """
    convert = result_converter(logits)
    x = to_torch(logits, "logits")
    mask = to_torch(bitmask, "bitmask")
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError("logits: expected a floating 2-d tensor [B, V]")
    if mask.dim() != 2 or mask.dtype != torch.int32:
        raise TypeError(
            f"bitmask: expected an int32 [B, W] tensor, got {mask.dtype} {tuple(mask.shape)}"
        )
    if mask.shape[0] != x.shape[0] or 32 * mask.shape[1] < x.shape[1]:
        raise ValueError(
            f"bitmask: expected [{x.shape[0]}, >= {-(-x.shape[1] // 32)}] for logits "
            f"{tuple(x.shape)}, got {tuple(mask.shape)}"
        )
    if mask.device != x.device:
        raise ValueError(f"bitmask: expected device {x.device}, got {mask.device}")
    return convert(eager_or_op(_apply_token_bitmask_op, _apply_token_bitmask_impl)(x, mask))
