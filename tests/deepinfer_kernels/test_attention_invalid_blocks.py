"""With value checks off, unreadable block ids are masked the same way on every path.

A key whose block column is past the table or whose id is outside the pool is skipped; a query
left with no key gets ``o = 0, lse = -inf``. The expectation is built here from the reference's
dense attention with that mask, independently of the code under test. The Triton kernels run
under ``TRITON_INTERPRET=1`` on CPU (tests/conftest.py), so an out-of-bounds read would show.
"""

from __future__ import annotations

import pytest
import torch

import deepinfer_kernels as dk
from deepinfer_kernels.reference.attention import attend_dense, attention_mask

NUM_BLOCKS, BLOCK, HKV, HQ, D = 4, 4, 2, 4, 16


def _expected(q, k_cache, v_cache, table, lens, cu, causal=True):  # type: ignore[no-untyped-def]
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:2], float("-inf"))
    for b, n in enumerate(lens):
        lo, hi = cu[b], cu[b + 1]
        ids, ok = [], []
        for j in range(n):
            col = j // BLOCK
            bid = table[b][col] if col < len(table[b]) else -1
            good = 0 <= bid < NUM_BLOCKS
            ids.append((bid if good else 0, j % BLOCK))
            ok.append(good)
        k = torch.stack([k_cache[i, s] for i, s in ids])
        v = torch.stack([v_cache[i, s] for i, s in ids])
        keep = attention_mask(hi - lo, n, causal=causal, sliding_window=None, device=q.device)
        keep = keep & torch.tensor(ok)[None, :]
        o, row_lse = attend_dense(q[lo:hi], k, v, keep, scale=D**-0.5, soft_cap=None)
        empty = ~keep.any(dim=1)
        out[lo:hi] = torch.where(empty[:, None, None], 0.0, o)
        lse[lo:hi] = torch.where(empty[:, None], float("-inf"), row_lse)
    return out, lse


def _inputs(table: list[list[int]], lens: list[int], q_lens: list[int]):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(0)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], HQ, D, generator=gen)
    k = torch.randn(NUM_BLOCKS, BLOCK, HKV, D, generator=gen)
    v = torch.randn(NUM_BLOCKS, BLOCK, HKV, D, generator=gen)
    t = torch.tensor(table, dtype=torch.int32)
    return (
        q,
        k,
        v,
        t,
        torch.tensor(lens, dtype=torch.int32),
        torch.tensor(cu, dtype=torch.int32),
        cu,
    )


# Ids past the pool (small and huge), negative ids, a whole sequence unreadable, and a
# seq_len past the table's capacity (its last positions have no column).
TABLES = [
    ([[0, 7], [2, 3]], [7, 8], [2, 3]),
    ([[1, -5], [2**30, 3]], [6, 8], [1, 4]),
    ([[-1, -1], [3, 1]], [5, 6], [2, 2]),
    ([[0, 1], [2, 3]], [11, 8], [3, 1]),
]


@pytest.mark.parametrize(("table", "lens", "q_lens"), TABLES)
@pytest.mark.parametrize("use_triton", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_unreadable_blocks_are_masked(table, lens, q_lens, use_triton, causal) -> None:  # type: ignore[no-untyped-def]
    q, k, v, t, sl, cu_t, cu = _inputs(table, lens, q_lens)
    with pytest.raises(ValueError, match=r"seq_lens|block_table"):
        dk.paged_attention(q, k, v, t, sl, cu_t)
    out, lse = dk.paged_attention(
        q, k, v, t, sl, cu_t, causal=causal, return_lse=True, use_triton=use_triton,
        check_values=False,
    )  # fmt: skip
    ref_out, ref_lse = _expected(q, k, v, table, lens, cu, causal=causal)
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(("table", "lens"), [(t, n) for t, n, _ in TABLES])
@pytest.mark.parametrize("use_triton", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_unreadable_blocks_are_masked(table, lens, use_triton, num_splits) -> None:  # type: ignore[no-untyped-def]
    q, k, v, t, sl, _, cu = _inputs(table, lens, [1] * len(lens))
    out, lse = dk.paged_decode_attention(
        q, k, v, t, sl, num_splits=num_splits, return_lse=True, use_triton=use_triton,
        check_values=False,
    )  # fmt: skip
    ref_out, ref_lse = _expected(q, k, v, table, lens, cu)
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=1e-5)
