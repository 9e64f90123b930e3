"""Per-request sampling parameters: broadcast scalars to tensors and validate them."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from deepinfer_kernels._interop import to_torch


class SamplingParams(NamedTuple):
    """Per-row parameters on the logits' device: float32 / int64 tensors of shape ``[B]``."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor


def _as_row_tensor(
    value: Any, name: str, batch: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a number or a tensor, got bool")
    if isinstance(value, (int, float)):
        return torch.full((batch,), value, dtype=dtype, device=device)
    t: torch.Tensor = to_torch(value, name)
    if t.dim() == 0:
        t = t.expand(batch)
    if tuple(t.shape) != (batch,):
        raise ValueError(f"{name}: expected shape ({batch},) or a scalar, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if dtype == torch.int64 and t.is_floating_point():
        raise TypeError(f"{name}: expected an integer tensor, got {t.dtype}")
    return t.to(dtype)


def normalize_params(
    logits: torch.Tensor,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any,
    check_values: bool,
) -> SamplingParams:
    """Validate ``logits`` ``[B, V]`` and turn each parameter into a ``[B]`` tensor."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits: expected a 2-d tensor [B, V]")
    if not logits.is_floating_point():
        raise TypeError(f"logits: expected a floating dtype, got {logits.dtype}")
    batch, vocab = logits.shape
    if vocab < 1:
        raise ValueError("logits: vocabulary size must be >= 1")
    dev = logits.device
    params = SamplingParams(
        temperature=_as_row_tensor(temperature, "temperature", batch, dev, torch.float32),
        top_k=_as_row_tensor(top_k, "top_k", batch, dev, torch.int64),
        top_p=_as_row_tensor(top_p, "top_p", batch, dev, torch.float32),
        min_p=_as_row_tensor(0.0 if min_p is None else min_p, "min_p", batch, dev, torch.float32),
    )
    if check_values and batch > 0:
        _check_values(logits, params)
    return params


def _check_values(logits: torch.Tensor, params: SamplingParams) -> None:
    temp, _, top_p, min_p = params
    if bool((~torch.isfinite(temp) | (temp < 0)).any()):
        raise ValueError("temperature: every entry must be finite and >= 0 (0 = greedy)")
    if bool((~(top_p > 0) | (top_p > 1)).any()):
        raise ValueError("top_p: every entry must lie in (0, 1] (1 = disabled)")
    if bool((~(min_p >= 0) | (min_p > 1)).any()):
        raise ValueError("min_p: every entry must lie in [0, 1] (0 = disabled)")
    # One pass: a row maximum is NaN if the row holds a NaN (amax propagates it), +inf if it
    # holds +inf, and -inf only if the whole row is -inf.
    row_max = logits.amax(dim=-1)
    bad = torch.stack(
        [torch.isnan(row_max).any(), torch.isposinf(row_max).any(), torch.isneginf(row_max).any()]
    ).tolist()
    if bad[0]:
        raise ValueError("logits: contains NaN")
    if bad[1]:
        raise ValueError("logits: contains +inf")
    if bad[2]:
        raise ValueError("logits: a row is entirely -inf")
