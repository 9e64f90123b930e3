"""``gather_logprobs``: the chosen token's log-probability and rank, and the top-k, per row.

What vLLM's sampler returns for ``logprobs=k`` / ``prompt_logprobs=k``: for each row, the
chosen token's entry and the ``k`` most likely tokens. The order is fixed (descending value,
ties by lower id), so a run repeats itself exactly. The top set comes from ``topk`` (one pass
over the vocabulary); only the candidates tied at its boundary are sorted, never the whole row.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op
from deepinfer_kernels._interop import to_torch
from deepinfer_kernels.verify.validate import want_value_checks


def stable_top_ids(x: torch.Tensor, k: int) -> torch.Tensor:
    """``[R, k]`` int64 ids of each row's ``k`` largest values (descending, ties by lower id,
    NaN counted as the largest, as ``torch.sort`` orders it)."""
    rows = x.shape[0]
    if k == 0 or rows == 0:
        return torch.empty(rows, k, dtype=torch.int64, device=x.device)
    key = torch.where(torch.isnan(x), float("inf"), x)
    kth = key.topk(k, dim=1).values[:, -1:]
    # Every value >= the k-th largest is a candidate: k of them, more only with ties at the
    # boundary. nonzero lists them row by row, ids ascending within a row.
    cand = key >= kth
    r, c = cand.nonzero(as_tuple=True)
    order = torch.sort(key[r, c], descending=True, stable=True).indices
    order = order[torch.sort(r[order], stable=True).indices]
    r, c = r[order], c[order]
    counts = cand.sum(dim=1)
    pos = torch.arange(r.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[r]
    keep = pos < k
    out = torch.empty(rows, k, dtype=torch.int64, device=x.device)
    out[r[keep], pos[keep]] = c[keep]
    return out


def _gather_logprobs_impl(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x = logprobs.to(torch.float32)
    chosen = x.gather(1, token_ids[:, None]).squeeze(1)
    # The rank counts the tokens strictly more likely than the chosen one, plus one.
    rank = (x > chosen[:, None]).sum(dim=1) + 1
    top_ids = stable_top_ids(x, min(num_top, x.shape[1]))
    return chosen, rank, top_ids, x.gather(1, top_ids)


_gather_logprobs_op = torch.library.custom_op(
    "deepinfer::gather_logprobs", _gather_logprobs_impl, mutates_args=()
)


@_gather_logprobs_op.register_fake
def _(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, vocab = logprobs.shape
    k = min(num_top, vocab)
    return (
        logprobs.new_empty((rows,), dtype=torch.float32),
        logprobs.new_empty((rows,), dtype=torch.int64),
        logprobs.new_empty((rows, k), dtype=torch.int64),
        logprobs.new_empty((rows, k), dtype=torch.float32),
    )


def gather_logprobs(
    logprobs: Any, token_ids: Any, num_top: int, *, check_values: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of ``logprobs`` ``[R, V]`` (log-probabilities, e.g. ``log_softmax`` of logits)
    and its chosen token ``token_ids[r]``:

    * ``chosen`` float32 ``[R]``: the chosen token's log-probability;
    * ``rank`` int64 ``[R]``: 1 + the number of tokens strictly more likely than it;
    * ``top_ids`` int64 ``[R, k]`` and ``top_logprobs`` float32 ``[R, k]``, ``k =
      min(num_top, V)``: the most likely tokens, descending, ties by lower id (their ranks are
      their 1-based positions).

    ``check_values`` (skipped while ``torch.compile`` traces) checks the ids on the host.

    Example::

        chosen, rank, top_ids, top_lp = gather_logprobs(torch.log_softmax(logits, -1), ids, 5)
    """
    x = to_torch(logprobs, "logprobs")
    ids = to_torch(token_ids, "token_ids")
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"logprobs: expected a floating 2-d tensor [R, V], got {tuple(x.shape)}")
    if ids.dim() != 1 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"token_ids: expected shape ({x.shape[0]},), got {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"token_ids: expected an integer tensor, got {ids.dtype}")
    if ids.device != x.device:
        raise ValueError(f"token_ids: expected device {x.device}, got {ids.device}")
    if not isinstance(num_top, int) or isinstance(num_top, bool) or num_top < 0:
        raise ValueError(f"num_top: expected an int >= 0, got {num_top!r}")
    ids = ids.to(torch.int64)
    check = want_value_checks(check_values) and ids.numel() > 0
    if check and (int(ids.min()) < 0 or int(ids.max()) >= x.shape[1]):
        raise ValueError(f"token_ids: every id must be in [0, {x.shape[1]})")
    run = eager_or_op(_gather_logprobs_op, _gather_logprobs_impl)
    chosen, rank, top_ids, top_logprobs = run(x, ids, num_top)
    return chosen, rank, top_ids, top_logprobs
