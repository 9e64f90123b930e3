# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels for speculative and greedy verification.

One program owns ``BLOCK_B`` requests. Acceptance needs two scalars per draft
(``p_t(x_k)``, ``p_d(x_k)``); only the one row that a token is drawn from is streamed, twice:
once for its mass, once for the inverse-CDF search. The uniforms come from the caller, so the
kernel computes exactly the torch path's decisions (the drawn token can differ only when a
uniform falls within rounding of a CDF boundary, since the cumulative sums are ordered
differently).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._triton_util import row_tiles
from deepinfer_kernels.verify.validate import ERR_DRAFT, ERR_EMPTY, ERR_TARGET, raise_for_flags


@triton.jit
def _speculative_verify_kernel(
    ids_ptr, n_ptr, pt_ptr, pd_ptr, au_ptr, su_ptr,
    out_ptr, acc_ptr, emit_ptr, err_ptr,
    B, G, V,
    s_ids_b, s_ids_g,
    s_pt_b, s_pt_g, s_pt_v,
    s_pd_b, s_pd_g, s_pd_v,
    HAS_DRAFT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rmask = rows < B
    rows64 = rows.to(tl.int64)
    n = tl.load(n_ptr + rows, mask=rmask, other=0)

    # Acceptance: draft k passes iff u_k * p_d(x_k) < p_t(x_k), stopping at the first failure.
    running = rmask
    stop = tl.zeros([BLOCK_B], dtype=tl.int64)
    # Error bits (see verify.validate): 1 target value, 2 draft value, 4 empty row.
    err = tl.zeros([BLOCK_B], dtype=tl.int32)
    for k in range(0, G):
        live = running & (k < n)
        tok = tl.load(ids_ptr + rows64 * s_ids_b + k * s_ids_g, mask=live, other=0).to(tl.int64)
        # An unchecked id outside [0, V) is rejected (as the torch path does) and never read.
        in_vocab = (tok >= 0) & (tok < V)
        tok = tl.where(in_vocab, tok, 0)
        p_t = tl.load(pt_ptr + rows64 * s_pt_b + k * s_pt_g + tok * s_pt_v, mask=live, other=0.0)
        if HAS_DRAFT:
            p_d = tl.load(
                pd_ptr + rows64 * s_pd_b + k * s_pd_g + tok * s_pd_v, mask=live, other=1.0
            )
        else:
            p_d = tl.full([BLOCK_B], 1.0, tl.float32)
        u = tl.load(au_ptr + rows64 * G + k, mask=live, other=1.0)
        p_t = p_t.to(tl.float32)
        p_d = p_d.to(tl.float32)
        err |= tl.where(live & ((p_t != p_t) | (p_t < 0) | (p_t == float("inf"))), 1, 0)
        err |= tl.where(live & ((p_d != p_d) | (p_d < 0) | (p_d == float("inf"))), 2, 0)
        ok = live & in_vocab & (u * p_d < p_t)
        stop += ok.to(tl.int64)
        running = ok

    rejected = stop < n
    draft_pos = tl.minimum(stop, tl.maximum(G - 1, 0))
    draft_tok = tl.load(
        ids_ptr + rows64 * s_ids_b + draft_pos * s_ids_g, mask=rmask & rejected, other=0
    ).to(tl.int64)
    draft_tok = tl.where((draft_tok >= 0) & (draft_tok < V), draft_tok, -1)  # no column: -1
    pt_row = pt_ptr + rows64 * s_pt_b + stop * s_pt_g
    pd_row = pd_ptr + rows64 * s_pd_b + draft_pos * s_pd_g

    # Pass 1: mass of the residual max(0, p_t - p_d) and of p_t itself.
    res_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
    pt_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        m2 = rmask[:, None] & (cols < V)[None, :]
        pt = tl.load(pt_row[:, None] + cols[None, :] * s_pt_v, mask=m2, other=0.0).to(tl.float32)
        if HAS_DRAFT:
            pd = tl.load(
                pd_row[:, None] + cols[None, :] * s_pd_v, mask=m2 & rejected[:, None], other=0.0
            ).to(tl.float32)
        else:
            pd = tl.where((cols[None, :] == draft_tok[:, None]) & rejected[:, None], 1.0, 0.0)
        res_sum += tl.sum(tl.maximum(pt - pd, 0.0), axis=1)
        pt_sum += tl.sum(pt, axis=1)
        bad_t = (pt != pt) | (pt < 0) | (pt == float("inf"))
        bad_d = (pd != pd) | (pd < 0) | (pd == float("inf"))
        err |= tl.where(tl.max(bad_t.to(tl.int32), axis=1) > 0, 1, 0)
        err |= tl.where(tl.max(bad_d.to(tl.int32), axis=1) > 0, 2, 0)
    use_res = rejected & (res_sum > 0)
    err |= tl.where(rmask & ~use_res & ~(pt_sum > 0), 4, 0)
    target = tl.load(su_ptr + rows, mask=rmask, other=0.0) * tl.where(use_res, res_sum, pt_sum)

    # Pass 2: first index whose cumulative weight exceeds u * total.
    acc = tl.zeros([BLOCK_B], dtype=tl.float32)
    token = tl.full([BLOCK_B], -1, dtype=tl.int64)
    last_pos = tl.full([BLOCK_B], -1, dtype=tl.int64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        m2 = rmask[:, None] & (cols < V)[None, :]
        pt = tl.load(pt_row[:, None] + cols[None, :] * s_pt_v, mask=m2, other=0.0).to(tl.float32)
        if HAS_DRAFT:
            pd = tl.load(
                pd_row[:, None] + cols[None, :] * s_pd_v, mask=m2 & use_res[:, None], other=0.0
            ).to(tl.float32)
        else:
            pd = tl.where((cols[None, :] == draft_tok[:, None]) & use_res[:, None], 1.0, 0.0)
        w = tl.where(use_res[:, None], tl.maximum(pt - pd, 0.0), pt)
        cdf = tl.cumsum(w, axis=1) + acc[:, None]
        cols64 = cols.to(tl.int64)[None, :]
        hit = tl.min(tl.where((cdf > target[:, None]) & (w > 0) & m2, cols64, V), axis=1)
        token = tl.where((token < 0) & (hit < V), hit, token)
        last_pos = tl.maximum(last_pos, tl.max(tl.where((w > 0) & m2, cols64, -1), axis=1))
        acc += tl.sum(w, axis=1)
    token = tl.where(token < 0, last_pos, token)

    for j in range(0, G + 1):
        if j < G:
            d = tl.load(ids_ptr + rows64 * s_ids_b + j * s_ids_g, mask=rmask & (j < stop), other=-1)
        else:
            d = tl.full([BLOCK_B], -1, dtype=tl.int64)
        val = tl.where(j < stop, d.to(tl.int64), tl.where(j == stop, token, -1))
        tl.store(out_ptr + rows64 * (G + 1) + j, val, mask=rmask)
    tl.store(acc_ptr + rows, stop, mask=rmask)
    tl.store(emit_ptr + rows, stop + 1, mask=rmask)
    tl.store(err_ptr + rows, err, mask=rmask)


def speculative_verify_triton(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    check_values: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, gamma = draft_token_ids.shape
    vocab = target_probs.shape[-1]
    dev = target_probs.device
    out = torch.empty((batch, gamma + 1), dtype=torch.int64, device=dev)
    acc = torch.empty((batch,), dtype=torch.int64, device=dev)
    emit = torch.empty((batch,), dtype=torch.int64, device=dev)
    if batch == 0:
        return out, acc, emit
    ids = draft_token_ids.to(torch.int64)
    n = num_draft_tokens.to(torch.int64).contiguous()
    au = accept_uniforms.to(torch.float32).contiguous()
    su = sample_uniforms.to(torch.float32).contiguous()
    pd = target_probs if draft_probs is None else draft_probs
    err = torch.empty((batch,), dtype=torch.int32, device=dev)
    block_b, block_v = row_tiles(batch, vocab, dev)
    grid = (triton.cdiv(batch, block_b),)
    _speculative_verify_kernel[grid](
        ids, n, target_probs, pd, au, su, out, acc, emit, err,
        batch, gamma, vocab,
        ids.stride(0), ids.stride(1),
        target_probs.stride(0), target_probs.stride(1), target_probs.stride(2),
        pd.stride(0), pd.stride(1), pd.stride(2),
        HAS_DRAFT=draft_probs is not None, BLOCK_B=block_b, BLOCK_V=block_v,
    )  # fmt: skip
    if check_values:
        # One small reduction and a host read: the price of naming a bad argument.
        raise_for_flags(_or_reduce(err))
    return out, acc, emit


def _or_reduce(flags: torch.Tensor) -> int:
    """Bitwise OR over the per-request flags, with a single host read."""
    bits = torch.tensor([ERR_TARGET, ERR_DRAFT, ERR_EMPTY], dtype=flags.dtype, device=flags.device)
    present = ((flags[:, None] & bits[None, :]) != 0).any(dim=0).tolist()
    return sum(b for b, p in zip((ERR_TARGET, ERR_DRAFT, ERR_EMPTY), present) if p)


@triton.jit
def _greedy_verify_kernel(
    ids_ptr, n_ptr, lg_ptr, out_ptr, acc_ptr, emit_ptr,
    B, G, V,
    s_ids_b, s_ids_g, s_lg_b, s_lg_g, s_lg_v,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rmask = rows < B
    rows64 = rows.to(tl.int64)
    n = tl.load(n_ptr + rows, mask=rmask, other=0)
    running = rmask
    stop = tl.zeros([BLOCK_B], dtype=tl.int64)
    for k in range(0, G + 1):
        # Rows that already stopped mask their loads, so they cost no memory traffic.
        best_val = tl.full([BLOCK_B], float("-inf"), dtype=tl.float32)
        best_idx = tl.zeros([BLOCK_B], dtype=tl.int64)
        row_ptr = lg_ptr + rows64 * s_lg_b + k * s_lg_g
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            m2 = running[:, None] & (cols < V)[None, :]
            x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf")).to(
                tl.float32
            )
            cmax = tl.max(x, axis=1)
            cidx = tl.min(tl.where(x == cmax[:, None], cols.to(tl.int64)[None, :], V), axis=1)
            better = cmax > best_val  # strict: an earlier chunk wins ties (lowest id)
            best_idx = tl.where(better, cidx, best_idx)
            best_val = tl.where(better, cmax, best_val)
        verified = running & (k < n)
        d = tl.load(ids_ptr + rows64 * s_ids_b + k * s_ids_g, mask=verified, other=-1)
        match = verified & (d.to(tl.int64) == best_idx)
        ending = running & ~match
        tl.store(out_ptr + rows64 * (G + 1) + k, best_idx, mask=ending)
        tl.store(out_ptr + rows64 * (G + 1) + k, d.to(tl.int64), mask=match)
        tl.store(
            out_ptr + rows64 * (G + 1) + k, tl.full([BLOCK_B], -1, tl.int64), mask=rmask & ~running
        )
        stop += match.to(tl.int64)
        running = match
    tl.store(acc_ptr + rows, stop, mask=rmask)
    tl.store(emit_ptr + rows, stop + 1, mask=rmask)


def greedy_verify_triton(
    draft_token_ids: torch.Tensor, target_logits: torch.Tensor, num_draft_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, gamma = draft_token_ids.shape
    vocab = target_logits.shape[-1]
    dev = target_logits.device
    out = torch.empty((batch, gamma + 1), dtype=torch.int64, device=dev)
    acc = torch.empty((batch,), dtype=torch.int64, device=dev)
    emit = torch.empty((batch,), dtype=torch.int64, device=dev)
    if batch == 0:
        return out, acc, emit
    ids = draft_token_ids.to(torch.int64)
    n = num_draft_tokens.to(torch.int64).contiguous()
    block_b, block_v = row_tiles(batch, vocab, dev)
    _greedy_verify_kernel[(triton.cdiv(batch, block_b),)](
        ids, n, target_logits, out, acc, emit,
        batch, gamma, vocab,
        ids.stride(0), ids.stride(1),
        target_logits.stride(0), target_logits.stride(1), target_logits.stride(2),
        BLOCK_B=block_b, BLOCK_V=block_v,
    )  # fmt: skip
    return out, acc, emit
