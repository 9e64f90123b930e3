"""The reference is the specification: check it against SDPA and against its own identities,
and check the fast CPU torch path against it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import (
    merge_attention_states_reference,
    paged_attention_reference,
    paged_decode_attention_reference,
)
from deepinfer_kernels.reference.attention import attend_dense, attention_mask
from deepinfer_kernels.testing import (
    PagedLayout,
    assert_attention_close,
    materialize,
    paged_attention_cases,
)


def _dense_case(seq_len: int, q_len: int, hq: int, hkv: int, d: int, seed: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_len, hq, d, generator=g)
    k = torch.randn(seq_len, hkv, d, generator=g)
    v = torch.randn(seq_len, hkv, d, generator=g)
    return q, k, v


@given(
    seq_len=st.integers(1, 40),
    q_frac=st.floats(0.01, 1.0),
    gqa=st.sampled_from([1, 2, 4]),
    d=st.sampled_from([8, 40]),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 12)),
    seed=st.integers(0, 1000),
)
def test_reference_matches_sdpa_dense(seq_len, q_frac, gqa, d, causal, window, seed):  # type: ignore[no-untyped-def]
    q_len = max(1, int(seq_len * q_frac))
    q, k, v = _dense_case(seq_len, q_len, 2 * gqa, 2, d, seed)
    mask = attention_mask(q_len, seq_len, causal=causal, sliding_window=window, device=q.device)
    out, _ = attend_dense(q, k, v, mask, scale=d**-0.5, soft_cap=None)
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1).repeat_interleave(gqa, 0),
        v.transpose(0, 1).repeat_interleave(gqa, 0),
        attn_mask=mask,
    ).transpose(0, 1)
    assert_attention_close(out, expected)


def test_reference_lse_is_logsumexp_of_scores() -> None:
    q, k, v = _dense_case(7, 3, 2, 1, 8, 0)
    mask = attention_mask(3, 7, causal=True, sliding_window=None, device=q.device)
    _, lse = attend_dense(q, k, v, mask, scale=0.25, soft_cap=None)
    # query 0 sits at position 4 and sees keys 0..4
    scores = (q[0, 1] @ k[:5, 0].T) * 0.25
    torch.testing.assert_close(lse[0, 1], torch.logsumexp(scores, 0))


def test_soft_cap_bounds_logits() -> None:
    q, k, v = _dense_case(6, 1, 1, 1, 4, 1)
    q = q * 100  # huge logits: capped at +-cap, so the softmax stays soft
    mask = attention_mask(1, 6, causal=True, sliding_window=None, device=q.device)
    _, lse = attend_dense(q, k, v, mask, scale=1.0, soft_cap=2.0)
    assert float(lse.max()) <= 2.0 + torch.log(torch.tensor(6.0)).item() + 1e-5


@settings(max_examples=15)
@given(case=paged_attention_cases(max_seq_len=48, block_sizes=(1, 4, 16)), split=st.data())
def test_extend_over_cached_prefix_equals_full_causal(case, split):  # type: ignore[no-untyped-def]
    """Running the last q_len queries of each sequence equals the same rows of full causal
    attention over every position."""
    lens = case.seq_lens.tolist()
    cu_full = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    g = torch.Generator().manual_seed(7)
    q_full = torch.randn(sum(lens), *case.q.shape[1:], generator=g).to(case.q.dtype)
    full = paged_attention_reference(
        q_full, case.k_cache, case.v_cache, case.block_table, case.seq_lens, cu_full,
        **case.options(),
    )  # fmt: skip
    cu = case.cu_seqlens_q.tolist()
    q = torch.cat(
        [q_full[cu_full[b + 1] - (cu[b + 1] - cu[b]) : cu_full[b + 1]] for b in range(len(lens))]
    )
    part = paged_attention_reference(
        q, case.k_cache, case.v_cache, case.block_table, case.seq_lens, case.cu_seqlens_q,
        **case.options(),
    )  # fmt: skip
    expected = torch.cat(
        [full[cu_full[b + 1] - (cu[b + 1] - cu[b]) : cu_full[b + 1]] for b in range(len(lens))]
    )
    assert_attention_close(part, expected)


@settings(max_examples=20)
@given(
    case=paged_attention_cases(
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        allow_non_causal=True,
        kinds=("decode", "verify", "extend"),
    )
)
def test_torch_path_matches_reference(case):  # type: ignore[no-untyped-def]
    out, lse = dk.paged_attention(
        *case.tensors(), **case.options(), return_lse=True, use_triton=False
    )
    ref_out, ref_lse = paged_attention_reference(*case.tensors(), **case.options(), return_lse=True)
    assert out.dtype == case.q.dtype and lse.dtype == torch.float32
    assert_attention_close(out, ref_out)
    assert_attention_close(lse, ref_lse, dtype=case.q.dtype)


def test_torch_path_long_prefill_chunks_queries() -> None:
    """A prefill longer than the short-tile limit runs in query chunks; still exact."""
    layout = PagedLayout(
        (70, 1), (90, 33), 16, 9, ((4, 0, 7, 2, 8, 1), (3, 6, 5, -1, -1, -1)), 4, 2, 16
    )
    case = materialize(layout, seed=3, sliding_window=40)
    out = dk.paged_attention(*case.tensors(), **case.options(), use_triton=False)
    assert_attention_close(out, paged_attention_reference(*case.tensors(), **case.options()))


@settings(max_examples=10)
@given(case=paged_attention_cases(), seed=st.integers(0, 100))
def test_shuffling_physical_blocks_changes_nothing(case, seed):  # type: ignore[no-untyped-def]
    moved = case.with_shuffled_blocks(seed)
    for path in (
        paged_attention_reference,
        lambda *a, **k: dk.paged_attention(*a, **k, use_triton=False),
    ):
        torch.testing.assert_close(
            path(*moved.tensors(), **moved.options()), path(*case.tensors(), **case.options())
        )


@settings(max_examples=15)
@given(case=paged_attention_cases(kinds=("decode",), allow_window=False), cut=st.floats(0, 1))
def test_merge_of_two_halves_equals_union(case, cut):  # type: ignore[no-untyped-def]
    """Split each sequence's keys into a prefix and the rest (via two non-causal attentions
    over disjoint block ranges) and merge: equals attention over all keys."""
    bs = case.k_cache.shape[1]
    lens = case.seq_lens.tolist()
    split_blocks = [int(-(-n // bs) * cut) for n in lens]
    table_b = case.block_table.clone()
    seq_a, seq_b = [], []
    for i, (n, nb) in enumerate(zip(lens, split_blocks, strict=True)):
        seq_a.append(min(n, nb * bs))
        seq_b.append(n - seq_a[-1])
        row = case.block_table[i].tolist()
        table_b[i] = torch.tensor(row[nb:] + [-1] * nb, dtype=torch.int32)
    cu = torch.arange(len(lens) + 1, dtype=torch.int32)
    # Non-causal: the decode query may read every key of each half.
    opts = {**case.options(), "causal": False}
    o_a, l_a = paged_attention_reference(
        case.q, case.k_cache, case.v_cache, case.block_table,
        torch.tensor(seq_a, dtype=torch.int32), cu, **opts, return_lse=True,
    )  # fmt: skip
    o_b, l_b = paged_attention_reference(
        case.q, case.k_cache, case.v_cache, table_b,
        torch.tensor(seq_b, dtype=torch.int32), cu, **opts, return_lse=True,
    )  # fmt: skip
    full, full_lse = paged_decode_attention_reference(
        *case.tensors()[:5], scale=case.scale, soft_cap=case.soft_cap, return_lse=True
    )
    for merge in (merge_attention_states_reference, dk.merge_attention_states):
        o, lse = merge(o_a, l_a, o_b, l_b)
        assert_attention_close(o, full)
        assert_attention_close(lse, full_lse)


def test_merge_with_empty_sides() -> None:
    o_a, o_b = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    inf = float("-inf")
    lse_a = torch.tensor([[0.5, inf], [inf, inf], [1.0, 2.0]])
    lse_b = torch.tensor([[inf, 0.1], [inf, inf], [1.0, 2.0]])
    for use_triton in (False, True):
        o, lse = dk.merge_attention_states(o_a, lse_a, o_b, lse_b, use_triton=use_triton)
        torch.testing.assert_close(o[0, 0], o_a[0, 0])
        torch.testing.assert_close(o[0, 1], o_b[0, 1])
        assert torch.all(o[1] == 0) and torch.all(torch.isneginf(lse[1]))
        torch.testing.assert_close(o[2], (o_a[2] + o_b[2]) / 2)
        torch.testing.assert_close(lse[2], torch.tensor([1.0, 2.0]) + torch.log(torch.tensor(2.0)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_output_dtype(dtype: torch.dtype) -> None:
    layout = PagedLayout((1, 3), (5, 9), 4, 6, ((2, 5, -1), (0, 4, 1)), 4, 1, 16)
    case = materialize(layout, dtype=dtype, seed=0)
    out, lse = dk.paged_attention(*case.tensors(), return_lse=True, use_triton=False)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_attention_close(out, paged_attention_reference(*case.tensors()))
