"""Cascade (shared-prefix) attention: a non-causal pass of every request's queries over the
shared prefix (more queries than prefix keys), a causal pass over each request's own suffix,
merged by ``merge_attention_states``, equals causal attention over prefix + suffix (#23 item 5).
"""

from __future__ import annotations

import pytest
import torch

import deepinfer_kernels as dk
from deepinfer_kernels.reference import paged_attention_reference

BLOCK, HKV, HQ, D = 4, 2, 4, 16


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _cu(lengths: list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


@pytest.mark.parametrize(
    ("prefix_blocks", "suffix_lens", "q_lens"),
    [
        (1, [3, 5, 2], [3, 2, 2]),  # 7 queries over a 4-key prefix
        (2, [6, 1, 4, 8], [6, 1, 4, 5]),  # 16 queries over 8 keys
        (3, [1], [1]),  # decode of one request: fewer queries than keys
    ],
)
@pytest.mark.parametrize("use_triton", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cascade_matches_full_attention(prefix_blocks, suffix_lens, q_lens, use_triton, dtype):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(prefix_blocks)
    prefix = prefix_blocks * BLOCK
    suffix_blocks = [-(-s // BLOCK) for s in suffix_lens]
    num_blocks = prefix_blocks + sum(suffix_blocks)
    k = torch.randn(num_blocks, BLOCK, HKV, D, generator=gen).to(dtype)
    v = torch.randn(num_blocks, BLOCK, HKV, D, generator=gen).to(dtype)
    cu = _cu(q_lens)
    q = torch.randn(cu[-1], HQ, D, generator=gen).to(dtype)
    # Block table: the prefix blocks [0, prefix_blocks), then each request's own blocks.
    width = max(suffix_blocks)
    own, nxt = [], prefix_blocks
    for nb in suffix_blocks:
        own.append(list(range(nxt, nxt + nb)) + [0] * (width - nb))
        nxt += nb
    full_table = _i32([list(range(prefix_blocks)) + row for row in own])
    full_lens = _i32([prefix + s for s in suffix_lens])

    # Pass 1: every query of the batch as one sequence over the prefix, non-causal.
    o_p, lse_p = dk.paged_attention(
        q, k, v, _i32([list(range(prefix_blocks))]), _i32([prefix]), _i32([0, cu[-1]]),
        causal=False, return_lse=True, use_triton=use_triton,
    )  # fmt: skip
    # Pass 2: each request over its own suffix, causal.
    o_s, lse_s = dk.paged_attention(
        q, k, v, _i32(own), _i32(suffix_lens), _i32(cu),
        causal=True, return_lse=True, use_triton=use_triton,
    )  # fmt: skip
    out, lse = dk.merge_attention_states(o_p, lse_p, o_s, lse_s, use_triton=use_triton)

    want, want_lse = paged_attention_reference(
        q, k, v, full_table, full_lens, _i32(cu), causal=True, return_lse=True
    )
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), want.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(lse, want_lse, atol=tol, rtol=tol)


@pytest.mark.parametrize("use_triton", [False, True])
def test_more_queries_than_keys_non_causal_and_empty_prefix(use_triton: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(3, BLOCK, HKV, D, generator=gen)
    v = torch.randn(3, BLOCK, HKV, D, generator=gen)
    q = torch.randn(13, HQ, D, generator=gen)
    table, lens, cu = _i32([[0, 1], [2, 0]]), _i32([5, 0]), _i32([0, 9, 13])
    out, lse = dk.paged_attention(
        q, k, v, table, lens, cu, causal=False, return_lse=True, use_triton=use_triton
    )
    want, want_lse = paged_attention_reference(
        q[:9], k, v, table[:1], lens[:1], cu[:2], causal=False, return_lse=True
    )
    torch.testing.assert_close(out[:9], want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse[:9], want_lse, atol=2e-5, rtol=1e-5)
    # No keys at all: o = 0 and lse = -inf (the identity of the merge).
    assert bool((out[9:] == 0).all()) and bool(torch.isneginf(lse[9:]).all())
    with pytest.raises(ValueError, match="q_len > seq_len"):
        dk.paged_attention(q, k, v, table, lens, cu, causal=True)
