"""Triton kernels (compiled on CUDA, interpreted on CPU) against the reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.attention import choose_num_splits
from deepinfer_kernels.reference import paged_attention_reference, paged_decode_attention_reference
from deepinfer_kernels.testing import (
    PagedLayout,
    assert_attention_close,
    materialize,
    paged_attention_cases,
    paged_layouts,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_unified(case) -> None:  # type: ignore[no-untyped-def]
    out, lse = dk.paged_attention(
        *case.tensors(), **case.options(), return_lse=True, use_triton=True
    )
    ref_out, ref_lse = paged_attention_reference(*case.tensors(), **case.options(), return_lse=True)
    assert out.dtype == case.q.dtype and out.device == case.q.device
    assert_attention_close(out, ref_out)
    assert_attention_close(lse, ref_lse, dtype=case.q.dtype, what="lse")


@settings(max_examples=12)
@given(case=paged_attention_cases(dtypes=DTYPES, device=DEVICE, block_sizes=(1, 16, 64)))
def test_unified_matches_reference_mixed_batches(case) -> None:  # type: ignore[no-untyped-def]
    _check_unified(case)


@settings(max_examples=6)
@given(
    case=paged_attention_cases(
        device=DEVICE, allow_non_causal=True, kinds=("verify", "extend"), max_batch=2
    )
)
def test_unified_non_causal(case) -> None:  # type: ignore[no-untyped-def]
    _check_unified(case)


@pytest.mark.parametrize("head_dim", [80, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unified_non_power_of_two_and_large_head_dims(head_dim: int, dtype: torch.dtype) -> None:
    layout = PagedLayout(
        q_lens=(1, 5), seq_lens=(19, 21), block_size=16, num_blocks=5,
        block_table=((3, 0), (1, 4)), num_q_heads=4, num_kv_heads=1, head_dim=head_dim,
    )  # fmt: skip
    _check_unified(materialize(layout, dtype=dtype, device=DEVICE, seed=head_dim, soft_cap=5.0))


@pytest.mark.parametrize("ratio", [1, 4, 8])
def test_unified_gqa_ratios_with_window(ratio: int) -> None:
    layout = PagedLayout(
        q_lens=(3, 1), seq_lens=(30, 7), block_size=4, num_blocks=12,
        block_table=((11, 2, 5, 7, 0, 9, 3, 1), (4, 6, -1, -1, -1, -1, -1, -1)),
        num_q_heads=2 * ratio, num_kv_heads=2, head_dim=32,
    )  # fmt: skip
    _check_unified(materialize(layout, device=DEVICE, seed=ratio, sliding_window=9))


def test_unified_sequences_without_queries() -> None:
    """A sequence with q_len 0 sits in the batch (e.g. finished); its neighbours are unaffected."""
    layout = PagedLayout(
        q_lens=(2, 0, 1), seq_lens=(6, 4, 3), block_size=4, num_blocks=5,
        block_table=((4, 1), (0, -1), (3, -1)), num_q_heads=2, num_kv_heads=2, head_dim=16,
    )  # fmt: skip
    _check_unified(materialize(layout, device=DEVICE, seed=5))


@settings(max_examples=10)
@given(
    layout=paged_layouts(kinds=("decode",), block_sizes=(1, 16), max_seq_len=64),
    dtype=st.sampled_from(DTYPES),
    window=st.one_of(st.none(), st.integers(1, 30)),
    soft_cap=st.sampled_from([None, 5.0]),
    num_splits=st.integers(1, 5),
)
def test_decode_splits_match_reference(layout, dtype, window, soft_cap, num_splits) -> None:  # type: ignore[no-untyped-def]
    case = materialize(layout, dtype=dtype, device=DEVICE, seed=1)
    args = case.tensors()[:5]
    kwargs = {"sliding_window": window, "soft_cap": soft_cap}
    out, lse = dk.paged_decode_attention(
        *args, **kwargs, num_splits=num_splits, return_lse=True, use_triton=True
    )
    ref_out, ref_lse = paged_decode_attention_reference(*args, **kwargs, return_lse=True)
    assert_attention_close(out, ref_out)
    assert_attention_close(lse, ref_lse, dtype=dtype, what="lse")


def test_decode_with_splits_equals_without() -> None:
    layout = PagedLayout(
        q_lens=(1, 1), seq_lens=(45, 3), block_size=4, num_blocks=14,
        block_table=(tuple(range(12)), (13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
        num_q_heads=4, num_kv_heads=2, head_dim=16,
    )  # fmt: skip
    case = materialize(layout, device=DEVICE, seed=2)
    args = case.tensors()[:5]
    base = dk.paged_decode_attention(*args, num_splits=1, use_triton=True)
    for splits in (2, 3, 8, 40):  # 40 > keys/BLOCK_N: some splits are empty
        torch.testing.assert_close(
            dk.paged_decode_attention(*args, num_splits=splits, use_triton=True),
            base,
            atol=1e-5,
            rtol=1e-5,
        )


def test_choose_num_splits() -> None:
    assert choose_num_splits(batch=1, num_kv_heads=8, max_kv_len=131072) == 33
    assert choose_num_splits(batch=128, num_kv_heads=8, max_kv_len=131072) == 1
    assert choose_num_splits(batch=1, num_kv_heads=1, max_kv_len=100) == 1
    assert choose_num_splits(batch=1, num_kv_heads=1, max_kv_len=10**7) == 64


@settings(max_examples=5)
@given(case=paged_attention_cases(device=DEVICE, max_batch=2), seed=st.integers(0, 50))
def test_unified_invariant_to_block_shuffle(case, seed) -> None:  # type: ignore[no-untyped-def]
    moved = case.with_shuffled_blocks(seed)
    torch.testing.assert_close(
        dk.paged_attention(*moved.tensors(), **moved.options(), use_triton=True),
        dk.paged_attention(*case.tensors(), **case.options(), use_triton=True),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [False, True])
def test_64bit_offsets_in_large_pool(decode: bool) -> None:
    """A pool of more than 2**31 elements: blocks at the far end need 64-bit offsets."""
    block_size, hkv, d = 16, 8, 128
    num_blocks = (2**31 // (block_size * hkv * d)) + 64  # > 2**31 elements, ~4.3 GB in fp16
    k_cache = torch.empty(num_blocks, block_size, hkv, d, dtype=torch.float16, device="cuda")
    v_cache = torch.empty_like(k_cache)
    used = torch.arange(num_blocks - 8, num_blocks, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    k_cache[used] = torch.randn(8, block_size, hkv, d, generator=g, device="cuda").half()
    v_cache[used] = torch.randn(8, block_size, hkv, d, generator=g, device="cuda").half()
    table = used.flip(0).to(torch.int32)[None]
    seq_lens = torch.tensor([120], dtype=torch.int32, device="cuda")
    q_len = 1 if decode else 7
    q = torch.randn(q_len, 4 * hkv, d, generator=g, device="cuda").half()
    cu = torch.tensor([0, q_len], dtype=torch.int32, device="cuda")
    expected = paged_attention_reference(q, k_cache, v_cache, table, seq_lens, cu)
    if decode:
        out = dk.paged_decode_attention(q, k_cache, v_cache, table, seq_lens, num_splits=3)
    else:
        out = dk.paged_attention(q, k_cache, v_cache, table, seq_lens, cu)
    assert_attention_close(out, expected)


@pytest.mark.parametrize("use_triton", [False, True])
def test_strided_index_tensors_and_query(use_triton: bool) -> None:
    """Views with non-unit strides (a column-major block table, a strided q) are honoured."""
    layout = PagedLayout(
        q_lens=(2, 1), seq_lens=(7, 5), block_size=4, num_blocks=5,
        block_table=((4, 1), (0, 3)), num_q_heads=2, num_kv_heads=1, head_dim=16,
    )  # fmt: skip
    case = materialize(layout, device=DEVICE, seed=9)
    table = case.block_table.t().contiguous().t()  # same values, column-major
    q = torch.cat([case.q, case.q], dim=-1)[..., ::2]  # strided last dim
    assert not table.is_contiguous() and not q.is_contiguous()
    args = (q, case.k_cache, case.v_cache, table, case.seq_lens, case.cu_seqlens_q)
    out = dk.paged_attention(*args, use_triton=use_triton)
    assert_attention_close(out, paged_attention_reference(*args))


def test_force_triton_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = PagedLayout((1,), (3,), 4, 1, ((0,),), 2, 1, 16)
    case = materialize(layout, device=DEVICE, seed=4)
    monkeypatch.setenv("DEEPINFER_FORCE_TRITON", "1")
    calls: list[int] = []
    import deepinfer_kernels.attention.triton_unified as unified

    original = unified.paged_attention_triton

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(unified, "paged_attention_triton", spy)
    out = dk.paged_attention(*case.tensors())
    assert calls == [1]
    assert_attention_close(out, paged_attention_reference(*case.tensors()))
