"""MLA attention (torch path, Triton split-K) and the latent-cache write against the reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import mla_paged_attention_reference, write_latent_kv_reference
from deepinfer_kernels.testing.mla import MLA_TOLERANCES, MlaCase, build_mla_case, mla_cases

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check(case: MlaCase, **kw: object) -> None:
    out, lse = dk.mla_paged_attention(
        *case.tensors(), scale=case.scale, causal=case.causal, return_lse=True, **kw
    )
    ref, ref_lse = mla_paged_attention_reference(
        *case.tensors(), scale=case.scale, causal=case.causal, return_lse=True
    )
    assert out.dtype == case.q_nope.dtype and out.shape == case.q_nope.shape
    atol, rtol = MLA_TOLERANCES[case.q_nope.dtype]
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=atol, rtol=rtol)
    torch.testing.assert_close(lse.cpu(), ref_lse.cpu(), atol=atol, rtol=rtol)


@settings(max_examples=15, deadline=None)
@given(case=mla_cases(device=DEVICE, allow_non_causal=True))
def test_torch_path_matches_reference(case: MlaCase) -> None:
    _check(case, use_triton=False)


@settings(max_examples=8, deadline=None)
@given(case=mla_cases(device=DEVICE, max_batch=2, max_seq_len=40, allow_non_causal=True))
def test_triton_matches_reference(case: MlaCase) -> None:
    _check(case, use_triton=True)


@pytest.mark.parametrize(
    ("num_splits", "dtype"),
    [(1, torch.float32), (3, torch.bfloat16), (8, torch.float32), (8, torch.float16)],
)
def test_triton_split_k_long_decode(num_splits: int, dtype: torch.dtype) -> None:
    # More splits than some sequences have key tiles: empty splits must merge to nothing.
    case = build_mla_case(
        [1, 1, 1], [150, 9, 1], heads=4, rank=32, rope=16, block_size=16,
        dtype=dtype, device=DEVICE, seed=num_splits,
    )  # fmt: skip
    _check(case, use_triton=True, num_splits=num_splits)
    out_split = dk.mla_decode_attention(
        *case.tensors()[:5], scale=case.scale, num_splits=num_splits, use_triton=True
    )
    out_ref = mla_paged_attention_reference(*case.tensors(), scale=case.scale)
    atol, rtol = MLA_TOLERANCES[dtype]
    torch.testing.assert_close(out_split.float().cpu(), out_ref.float().cpu(), atol=atol, rtol=rtol)


def test_deepseek_widths() -> None:
    # DeepSeek-V3: kv_lora_rank 512, rope 64 (not powers of two together: 576 per row).
    case = build_mla_case([1, 3], [37, 20], heads=16, rank=512, rope=64, block_size=64, seed=3)
    _check(case, use_triton=False)
    _check(case, use_triton=True, num_splits=2)


def test_equals_standard_attention_with_absorbed_weights() -> None:
    # MLA is MQA whose single key is [c_kv | k_rope] and value c_kv: check against SDPA.
    case = build_mla_case([4], [11], heads=2, rank=24, rope=8, block_size=4, seed=5)
    out = dk.mla_paged_attention(*case.tensors(), scale=case.scale)
    c = mla_gather(case)
    q = torch.cat([case.q_nope, case.q_rope], -1).transpose(0, 1)  # [H, m, R+P]
    mask = torch.ones(4, 11, dtype=torch.bool).tril(diagonal=7)
    expect = torch.nn.functional.scaled_dot_product_attention(
        q, c[None].expand(2, -1, -1), c[None, :, :24].expand(2, -1, -1),
        attn_mask=mask, scale=case.scale,
    ).transpose(0, 1)  # fmt: skip
    torch.testing.assert_close(out, expect, atol=1e-5, rtol=1e-5)


def mla_gather(case: MlaCase) -> torch.Tensor:
    from deepinfer_kernels.reference.mla import gather_latent

    return gather_latent(case.latent_cache, case.block_table[0], int(case.seq_lens[0]))


@settings(max_examples=20, deadline=None)
@given(
    tokens=st.integers(0, 10),
    block_size=st.sampled_from([1, 4, 8]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 1000),
)
def test_write_latent_kv_matches_reference(
    tokens: int, block_size: int, dtype: torch.dtype, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(4, block_size, 24, generator=gen).to(dtype)
    expect = cache.clone()
    slots = torch.randperm(4 * block_size, generator=gen)[:tokens]
    slots = torch.where(torch.rand(slots.shape, generator=gen) < 0.25, -1, slots)
    kv, kr = (
        torch.randn(slots.numel(), 16, generator=gen),
        torch.randn(slots.numel(), 8, generator=gen),
    )
    dk.write_latent_kv(kv, kr, cache, slots.to(torch.int32))
    write_latent_kv_reference(kv, kr, expect, slots)
    assert torch.equal(cache, expect)


def test_write_then_attend_round_trip() -> None:
    rank, rope, heads = 32, 8, 2
    cache = torch.zeros(4, 8, rank + rope)
    kv, kr = torch.randn(10, rank), torch.randn(10, rope)
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    slots = torch.tensor([2 * 8 + i for i in range(8)] + [0, 1], dtype=torch.int32)
    dk.write_latent_kv(kv, kr, cache, slots)
    qn, qr = torch.randn(1, heads, rank), torch.randn(1, heads, rope)
    out = dk.mla_decode_attention(qn, qr, cache, table, torch.tensor([10], dtype=torch.int32),
                                  scale=0.2)  # fmt: skip
    s = (qn[0] @ kv.T + qr[0] @ kr.T) * 0.2
    torch.testing.assert_close(out[0], s.softmax(-1) @ kv, atol=1e-5, rtol=1e-5)


def test_torch_compile_and_fake() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = build_mla_case([1, 2], [5, 9], heads=2, rank=16, rope=8, block_size=4, seed=1)
    fn = torch.compile(lambda *t: dk.mla_paged_attention(*t, scale=0.3, use_triton=False),
                       fullgraph=True)  # fmt: skip
    torch.testing.assert_close(
        fn(*case.tensors()), mla_paged_attention_reference(*case.tensors(), scale=0.3),
        atol=1e-5, rtol=1e-5,
    )  # fmt: skip
    with FakeTensorMode():
        out, lse = torch.ops.deepinfer.mla_paged_attention(
            torch.empty(3, 2, 16), torch.empty(3, 2, 8), torch.empty(4, 4, 24),
            torch.empty(2, 3, dtype=torch.int32), torch.empty(2, dtype=torch.int32),
            torch.empty(3, dtype=torch.int32), 0.3, True, 0, False,
        )  # fmt: skip
    assert out.shape == (3, 2, 16) and lse.shape == (3, 2)


def _base() -> dict[str, object]:
    case = build_mla_case([1, 2], [5, 9], heads=2, rank=16, rope=8, block_size=4, seed=1)
    names = ("q_nope_absorbed", "q_rope", "latent_cache", "block_table", "seq_lens",
             "cu_seqlens_q")  # fmt: skip
    return dict(zip(names, case.tensors(), strict=True)) | {"scale": 0.3}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"q_nope_absorbed": torch.zeros(3, 16)}, "q_nope_absorbed"),
        ({"q_rope": torch.zeros(3, 3, 8)}, "q_rope"),
        ({"q_rope": torch.zeros(3, 2, 8, dtype=torch.float16)}, "q_rope"),
        ({"latent_cache": torch.zeros(4, 4, 25)}, "latent_cache"),
        ({"latent_cache": torch.zeros(4, 3, 24)}, "latent_cache"),
        ({"block_table": torch.zeros(2, 3, dtype=torch.int64)}, "block_table"),
        ({"seq_lens": torch.tensor([5, 99], dtype=torch.int32)}, "seq_lens"),
        ({"seq_lens": torch.tensor([5, -1], dtype=torch.int32)}, "seq_lens"),
        ({"cu_seqlens_q": torch.tensor([0, 1, 2], dtype=torch.int32)}, "cu_seqlens_q"),
        ({"cu_seqlens_q": torch.tensor([0, 2, 1], dtype=torch.int32)}, "cu_seqlens_q"),
        ({"seq_lens": torch.tensor([0, 9], dtype=torch.int32)}, "q_len > seq_len"),
        ({"block_table": torch.full((2, 3), 7, dtype=torch.int32)}, "block_table"),
        ({"scale": None}, "scale"),
        ({"scale": -1.0}, "scale"),
        ({"num_splits": 0}, "num_splits"),
        ({"causal": 1}, "causal"),
    ],
)
def test_bad_input_names_the_argument(change: dict[str, object], match: str) -> None:
    args = _base() | change
    with pytest.raises((ValueError, TypeError), match=match):
        dk.mla_paged_attention(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"kv_latent": torch.zeros(3)}, "kv_latent"),
        ({"k_rope": torch.zeros(2, 8)}, "k_rope"),
        ({"latent_cache": torch.zeros(4, 4, 23)}, "latent_cache"),
        ({"slot_mapping": torch.zeros(3)}, "slot_mapping"),
        ({"slot_mapping": torch.tensor([0, 16, 1], dtype=torch.int32)}, "slot_mapping"),
        ({"slot_mapping": torch.tensor([0, 5, 5], dtype=torch.int32)}, "slot_mapping"),
    ],
)
def test_write_bad_input_names_the_argument(change: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "kv_latent": torch.zeros(3, 16),
        "k_rope": torch.zeros(3, 8),
        "latent_cache": torch.zeros(4, 4, 24),
        "slot_mapping": torch.tensor([0, 1, -1], dtype=torch.int32),
    }
    args |= change
    with pytest.raises((ValueError, TypeError), match=match):
        dk.write_latent_kv(**args)  # type: ignore[arg-type]


def test_unchecked_write_never_goes_out_of_bounds() -> None:
    cache = torch.zeros(2, 4, 24)
    slots = torch.tensor([3, 8, 100], dtype=torch.int32)
    dk.write_latent_kv(torch.ones(3, 16), torch.ones(3, 8), cache, slots, check_values=False)
    assert cache.flatten(0, 1)[3].eq(1).all() and cache.sum() == 24
