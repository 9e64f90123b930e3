"""Merging two partial attentions over disjoint key sets (cascade / shared-prefix attention).

With ``lse = log(exp(lse_a) + exp(lse_b))`` the merged output is
``o = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b``; a side with ``lse = -inf`` (no keys)
contributes nothing and two empty sides give ``o = 0``, ``lse = -inf``.
"""

from __future__ import annotations

import torch


def check_merge_inputs(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> None:
    for name, t in (("o_a", o_a), ("lse_a", lse_a), ("o_b", o_b), ("lse_b", lse_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t)!r}")
        if t.device != o_a.device:
            raise ValueError(f"{name}: expected device {o_a.device} (same as o_a), got {t.device}")
    if o_a.dim() != 3:
        raise ValueError(f"o_a: expected [tokens, heads, head_dim], got shape {tuple(o_a.shape)}")
    if o_a.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"o_a: expected a float32/float16/bfloat16 dtype, got {o_a.dtype}")
    if tuple(o_b.shape) != tuple(o_a.shape):
        raise ValueError(f"o_b: expected shape {tuple(o_a.shape)} (as o_a), got {tuple(o_b.shape)}")
    if o_b.dtype != o_a.dtype:
        raise ValueError(f"o_b: expected dtype {o_a.dtype} (as o_a), got {o_b.dtype}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(t.shape) != tuple(o_a.shape[:2]):
            raise ValueError(
                f"{name}: expected shape {tuple(o_a.shape[:2])} (o_a without head_dim), "
                f"got {tuple(t.shape)}"
            )
        if t.dtype != torch.float32:
            raise ValueError(f"{name}: expected dtype torch.float32, got {t.dtype}")


def merge_attention_states_torch(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise torch implementation (fp32 math, output in ``o_a``'s dtype)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa = torch.exp(lse_a - m)
    wb = torch.exp(lse_b - m)
    total = wa + wb
    lse = m + torch.log(total)
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    out = (wa * inv)[..., None] * o_a.float() + (wb * inv)[..., None] * o_b.float()
    return out.to(o_a.dtype), lse
