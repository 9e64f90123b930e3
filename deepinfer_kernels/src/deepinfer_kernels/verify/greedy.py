"""``greedy_verify``: accept drafts while they match the target argmax (public op)."""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.verify.torch_verify import greedy_verify_torch
from deepinfer_kernels.verify.types import VerifyResult
from deepinfer_kernels.verify.validate import (
    check_counts_and_ids,
    check_verify_structure,
    want_value_checks,
)


def _greedy_verify_impl(
    draft_token_ids: torch.Tensor,
    target_logits: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if use_triton:
        from deepinfer_kernels.verify.triton_verify import greedy_verify_triton

        return greedy_verify_triton(draft_token_ids, target_logits, num_draft_tokens)
    return greedy_verify_torch(draft_token_ids, target_logits, num_draft_tokens)


_greedy_verify_op = torch.library.custom_op(
    "deepinfer::greedy_verify", _greedy_verify_impl, mutates_args=()
)


@_greedy_verify_op.register_fake
def _(
    draft_token_ids: torch.Tensor,
    target_logits: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    use_triton: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, gamma = draft_token_ids.shape
    out = draft_token_ids.new_empty((batch, gamma + 1), dtype=torch.int64)
    counts = draft_token_ids.new_empty((batch,), dtype=torch.int64)
    return out, counts, torch.empty_like(counts)


def greedy_verify(
    draft_token_ids: Any,
    target_logits: Any,
    num_draft_tokens: Any,
    *,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> VerifyResult:
    """Greedy verification: with ``a_k = argmax target_logits[b, k]`` (ties: lowest id), accept
    drafts ``k = 0, 1, ...`` while ``k < num_draft_tokens[b]`` and ``draft_token_ids[b, k] ==
    a_k``; then emit ``a_j`` at the stop position ``j`` (a correction, or the bonus token when
    all verified drafts matched).

    Shapes as in ``speculative_verify`` with ``target_logits`` ``[B, G+1, V]`` (logits or
    probabilities: only the argmax matters). NaN logits raise ``ValueError`` (when
    ``check_values``). Returns a ``VerifyResult``.
    """
    convert = result_converter(draft_token_ids, target_logits, num_draft_tokens)
    ids = to_torch(draft_token_ids, "draft_token_ids")
    logits = to_torch(target_logits, "target_logits")
    n = to_torch(num_draft_tokens, "num_draft_tokens")
    _, _, vocab = check_verify_structure(ids, None, logits, n, "target_logits")
    if want_value_checks(check_values):
        check_counts_and_ids(ids, n, vocab)
        if logits.numel() and bool(torch.isnan(logits.amax(dim=-1)).any()):  # amax keeps NaN
            raise ValueError("target_logits: contains NaN")
    # Unchecked counts are clamped into [0, G] so no path reads past the draft block; an id
    # outside [0, V) never equals an argmax, so it is rejected on every path.
    n = n.clamp(0, ids.shape[1])
    triton = should_use_triton(logits.device, use_triton)
    out, acc, emitted = eager_or_op(_greedy_verify_op, _greedy_verify_impl)(ids, logits, n, triton)
    return VerifyResult(convert(out), convert(acc), convert(emitted))
