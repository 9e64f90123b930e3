"""Argument checks for the verification ops.

Structure (rank, shape, dtype, device) is always checked. Value checks (out-of-range ids and
counts here; NaN, infinite or negative probabilities inside the ops, on exactly the entries the
algorithm reads) synchronise on CUDA; they run unless the caller passes ``check_values=False``
and are skipped while ``torch.compile`` traces.
"""

from __future__ import annotations

import torch

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def want_value_checks(check_values: bool) -> bool:
    return check_values and not torch.compiler.is_compiling()


def check_int_tensor(t: torch.Tensor, name: str, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t)!r}")
    if t.dtype not in _INT_DTYPES:
        raise TypeError(f"{name}: expected an integer dtype, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")


def check_float_tensor(t: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t)!r}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating dtype, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")


def check_same_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name}: expected device {device}, got {t.device}")


def check_verify_structure(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    target_name: str,
) -> tuple[int, int, int]:
    """Validate shapes and dtypes; returns ``(B, G, V)``."""
    check_int_tensor(draft_token_ids, "draft_token_ids", 2)
    batch, gamma = draft_token_ids.shape
    if not isinstance(target, torch.Tensor) or target.dim() != 3:
        raise ValueError(f"{target_name}: expected a 3-d tensor [B, G+1, V]")
    vocab = target.shape[-1]
    if vocab < 1:
        raise ValueError(f"{target_name}: vocabulary size must be >= 1")
    if draft_probs is not None:
        # The draft is checked against draft_token_ids on its own first, so a vocabulary
        # mismatch is reported on the tensor whose leading dims are right and last dim is not.
        if not isinstance(draft_probs, torch.Tensor) or draft_probs.dim() != 3:
            raise ValueError("draft_probs: expected a 3-d tensor [B, G, V] or None")
        check_float_tensor(draft_probs, "draft_probs", (batch, gamma, draft_probs.shape[-1]))
    check_float_tensor(target, target_name, (batch, gamma + 1, vocab))
    if draft_probs is not None and draft_probs.shape[-1] != vocab:
        raise ValueError(
            f"{target_name}: vocabulary size {vocab} does not match draft_probs' "
            f"{draft_probs.shape[-1]} (both are [..., V] over the same vocabulary)"
        )
    check_int_tensor(num_draft_tokens, "num_draft_tokens", 1)
    if num_draft_tokens.shape[0] != batch:
        raise ValueError(
            f"num_draft_tokens: expected shape ({batch},), got {tuple(num_draft_tokens.shape)}"
        )
    check_same_device(
        target.device,
        draft_token_ids=draft_token_ids,
        draft_probs=draft_probs,
        num_draft_tokens=num_draft_tokens,
    )
    return batch, gamma, vocab


def check_counts_and_ids(
    draft_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor, vocab: int
) -> None:
    """``num_draft_tokens`` in ``[0, G]``; verified draft ids in ``[0, V)``. Ids at positions
    ``>= num_draft_tokens[b]`` are padding and may hold anything (typically -1)."""
    gamma = draft_token_ids.shape[1]
    if num_draft_tokens.numel() and bool(
        ((num_draft_tokens < 0) | (num_draft_tokens > gamma)).any()
    ):
        raise ValueError(f"num_draft_tokens: every entry must lie in [0, {gamma}]")
    positions = torch.arange(gamma, device=draft_token_ids.device)
    verified = positions[None, :] < num_draft_tokens[:, None].to(torch.int64)
    ids = draft_token_ids.to(torch.int64)
    bad = verified & ((ids < 0) | (ids >= vocab))
    if bool(bad.any()):
        raise ValueError(
            f"draft_token_ids: verified draft ids must lie in [0, {vocab}) "
            "(padding beyond num_draft_tokens may be -1)"
        )


def _sum_tolerance(dtype: torch.dtype) -> float:
    """How far a row's sum may stray from 1: rounding each entry of a softmax to the storage
    dtype moves the sum by at most about its relative precision."""
    return 1e-3 if dtype in (torch.float32, torch.float64) else 1e-2


def check_rows_normalised(
    probs: torch.Tensor, num_draft_tokens: torch.Tensor, name: str, extra_rows: int
) -> None:
    """Rows ``k < num_draft_tokens[b] + extra_rows`` of ``probs [B, L, V]`` (the ones the
    algorithm reads) must each sum to 1 within the dtype's tolerance; else ``ValueError``
    naming ``name`` and the first bad row. The acceptance ratio ``p_t(x) / p_d(x)`` is only
    lossless for normalised rows, so they are required rather than silently rescaled."""
    if probs.numel() == 0:
        return
    sums = probs.sum(dim=-1, dtype=torch.float64)
    pos = torch.arange(probs.shape[1], device=probs.device)
    read = pos[None, :] < num_draft_tokens.to(torch.int64)[:, None] + extra_rows
    tol = _sum_tolerance(probs.dtype)
    bad = read & ~((sums - 1.0).abs() <= tol)  # NaN sums are bad too
    if not bool(bad.any()):
        return
    b, k = (int(i) for i in bad.nonzero()[0])
    total = float(sums[b, k])
    if total == 0.0:
        raise ValueError(
            f"{name}: row [{b}, {k}] that a token is drawn from has zero total probability"
        )
    raise ValueError(
        f"{name}: row [{b}, {k}] sums to {total:.6g}; rows must be normalised probability "
        f"distributions (sum 1 within {tol:g} for {probs.dtype})"
    )


ERR_TARGET = 1
ERR_DRAFT = 2
ERR_EMPTY = 4


def raise_for_flags(flags: int) -> None:
    """Turn the error bits of a verification pass into a ``ValueError`` naming the argument."""
    if flags & ERR_TARGET:
        raise ValueError("target_probs: a probability that was read is NaN, infinite or negative")
    if flags & ERR_DRAFT:
        raise ValueError("draft_probs: a probability that was read is NaN, infinite or negative")
    if flags & ERR_EMPTY:
        raise ValueError(
            "target_probs: a row that a token is drawn from has zero total probability"
        )
