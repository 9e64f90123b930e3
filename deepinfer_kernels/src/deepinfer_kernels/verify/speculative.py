"""``speculative_verify``: lossless rejection sampling of a draft block (public op)."""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.verify.torch_verify import speculative_verify_torch
from deepinfer_kernels.verify.types import VerifyResult
from deepinfer_kernels.verify.validate import (
    check_counts_and_ids,
    check_rows_normalised,
    check_verify_structure,
    want_value_checks,
)


def _speculative_verify_impl(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    use_triton: bool,
    check_values: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if use_triton:
        from deepinfer_kernels.verify.triton_verify import speculative_verify_triton

        return speculative_verify_triton(
            draft_token_ids,
            draft_probs,
            target_probs,
            num_draft_tokens,
            accept_uniforms,
            sample_uniforms,
            check_values,
        )
    return speculative_verify_torch(
        draft_token_ids,
        draft_probs,
        target_probs,
        num_draft_tokens,
        accept_uniforms,
        sample_uniforms,
        check_values,
    )


_speculative_verify_op = torch.library.custom_op(
    "deepinfer::speculative_verify", _speculative_verify_impl, mutates_args=()
)


@_speculative_verify_op.register_fake
def _(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    use_triton: bool,
    check_values: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, gamma = draft_token_ids.shape
    out = draft_token_ids.new_empty((batch, gamma + 1), dtype=torch.int64)
    counts = draft_token_ids.new_empty((batch,), dtype=torch.int64)
    return out, counts, torch.empty_like(counts)


def speculative_verify(
    draft_token_ids: Any,
    draft_probs: Any,
    target_probs: Any,
    num_draft_tokens: Any,
    *,
    generator: torch.Generator | None = None,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> VerifyResult:
    """Verify a block of draft tokens losslessly (Leviathan et al. 2023; Chen et al. 2023).

    Shapes: ``draft_token_ids`` ``[B, G]`` (int), ``draft_probs`` ``[B, G, V]`` or ``None``
    (deterministic draft: one-hot at the draft token), ``target_probs`` ``[B, G+1, V]``,
    ``num_draft_tokens`` ``[B]`` (int, each in ``[0, G]``: how many drafts of row ``b`` are
    verified; ids beyond it are padding, e.g. -1, and are never read).

    For request ``b`` with ``n = num_draft_tokens[b]``, draft ``k < n`` is accepted iff
    ``u_k * p_d(x_k) < p_t(x_k)`` with ``u_k ~ U[0, 1)``, i.e. with probability
    ``min(1, p_t(x_k) / p_d(x_k))``; a target zero is never accepted (also for ``u_k == 0``) and
    a draft zero under a positive target is always accepted. At the first rejection ``k`` one
    token is drawn from ``norm(max(0, p_t[k] - p_d[k]))`` (from ``p_t[k]`` when that residual is
    all zero, which only rounding can cause); if all ``n`` pass, a bonus token is drawn from
    ``p_t[n]``. Draws use the inverse CDF, which never returns a zero-probability token. The
    emitted tokens are distributed exactly as ``n + 1`` steps of sampling from the target.

    Rows must be normalised (each sums to 1): the acceptance ratio is only lossless then, so
    nothing is rescaled. With ``check_values`` every row the algorithm reads (draft rows
    ``k < n``, target rows ``k <= n``) must sum to 1 within 1e-3 (fp32/fp64) or 1e-2
    (fp16/bf16), and the values read must be finite and non-negative, else ``ValueError``
    names the argument (rows that are never read are not inspected). With
    ``check_values=False`` nothing is read out of bounds and both paths agree: counts are
    clamped into ``[0, G]`` and a verified id outside ``[0, V)`` is rejected (as if
    ``p_t = 0``), so it is never emitted. Checks are skipped under ``torch.compile``.
    ``generator`` seeds the ``B * G + B``
    uniforms, drawn on the tensors' device. CUDA runs the Triton kernel; ``use_triton``
    overrides. DLPack arrays are accepted and answered in kind.

    Returns ``VerifyResult(output_ids [B, G+1] padded with -1, num_accepted [B],
    num_emitted [B])``, all int64.
    """
    convert = result_converter(draft_token_ids, draft_probs, target_probs, num_draft_tokens)
    ids = to_torch(draft_token_ids, "draft_token_ids")
    p_d = to_torch(draft_probs, "draft_probs")
    p_t = to_torch(target_probs, "target_probs")
    n = to_torch(num_draft_tokens, "num_draft_tokens")
    batch, gamma, vocab = check_verify_structure(ids, p_d, p_t, n, "target_probs")
    checks = want_value_checks(check_values)
    if checks:
        check_counts_and_ids(ids, n, vocab)
        check_rows_normalised(p_t, n, "target_probs", extra_rows=1)
        if p_d is not None:
            check_rows_normalised(p_d, n, "draft_probs", extra_rows=0)
    # Unchecked counts are clamped into [0, G] so no path reads past the draft block.
    n = n.clamp(0, gamma)
    triton = should_use_triton(p_t.device, use_triton)
    accept_u = torch.rand((batch, gamma), generator=generator, device=p_t.device)
    sample_u = torch.rand((batch,), generator=generator, device=p_t.device)
    out, acc, emitted = eager_or_op(_speculative_verify_op, _speculative_verify_impl)(
        ids, p_d, p_t, n, accept_u, sample_u, triton, checks
    )
    return VerifyResult(convert(out), convert(acc), convert(emitted))
