"""``torch.ops.deepinfer.causal_prefill_attention``: the op against its fp64 reference (on the
compiled kernel where numpy's OpenBLAS is found, on the reference elsewhere), its fake, its
schema, and its argument checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu.causal_attention_op import causal_prefill_attention
from deepinfer_kernels.reference.cpu import causal_prefill_attention_reference

BLOCK = 16


def _case(t: int, start: int, hq: int, hkv: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    blocks = -(-(start + t) // BLOCK)
    k_cache = torch.randn(blocks, BLOCK, hkv, d, generator=g)
    v_cache = torch.randn(blocks, BLOCK, hkv, d, generator=g)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 2
    return qkv, k_cache, v_cache


@settings(max_examples=20, deadline=None)
@given(
    t=st.integers(1, 90),
    start=st.integers(0, 40),
    heads=st.sampled_from([(1, 1), (4, 2), (6, 3), (8, 1)]),
    d=st.sampled_from([8, 20, 64, 72]),
    seed=st.integers(0, 2**16),
)
def test_op_matches_the_reference(
    t: int, start: int, heads: tuple[int, int], d: int, seed: int
) -> None:
    hq, hkv = heads
    qkv, k_cache, v_cache = _case(t, start, hq, hkv, d, seed)
    scale = float(d) ** -0.5
    with torch.no_grad():
        out = causal_prefill_attention(qkv, hq, d, k_cache, v_cache, start=start, scale=scale)
    want = causal_prefill_attention_reference(qkv, hq, d, k_cache, v_cache, start, scale)
    assert out.shape == (t, hq, d) and out.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=0, atol=2e-5 * max(1.0, want.abs().max().item()))


def test_first_row_returns_its_one_value_exactly() -> None:
    qkv, k_cache, v_cache = _case(33, 0, 4, 2, 64, seed=3)
    with torch.no_grad():
        out = causal_prefill_attention(qkv, 4, 64, k_cache, v_cache, start=0, scale=0.125)
    torch.testing.assert_close(out[0], v_cache[0, 0].repeat_interleave(2, 0), rtol=0, atol=0)


def test_opcheck_and_fake() -> None:
    qkv, k_cache, v_cache = _case(20, 5, 4, 2, 8, seed=4)
    torch.library.opcheck(
        torch.ops.deepinfer.causal_prefill_attention.default,
        (qkv, 4, 8, k_cache, v_cache, 5, 0.35),
        test_utils=("test_schema", "test_faketensor"),
    )
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = torch.ops.deepinfer.causal_prefill_attention(
            mode.from_tensor(qkv), 4, 8, mode.from_tensor(k_cache), mode.from_tensor(v_cache),
            5, 0.35,
        )  # fmt: skip
    assert tuple(fake.shape) == (20, 4, 8)


def test_bad_arguments_name_themselves() -> None:
    qkv, k_cache, v_cache = _case(20, 0, 4, 2, 8, seed=5)

    def call(heads: int = 4, start: int = 0, **given: torch.Tensor) -> None:
        args = {"qkv": qkv, "k_cache": k_cache, "v_cache": v_cache, **given}
        causal_prefill_attention(args["qkv"], heads, 8, args["k_cache"], args["v_cache"],
                                 start=start, scale=0.3)  # fmt: skip

    with pytest.raises(ValueError, match="start"):
        call(start=13)
    with pytest.raises(ValueError, match="num_heads"):
        call(heads=3)
    with pytest.raises(ValueError, match="qkv"):
        call(qkv=qkv[:, :10])
    with pytest.raises(ValueError, match="v_cache"):
        call(v_cache=v_cache[:, :8])
