"""``deepinfer_kernels.cpu.linear``: equal to ``F.linear`` for every row count, dtype and shape."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu.linear import (
    CPU_TRANSPOSED_ROWS,
    PACKED_MIN_ROWS,
    PackedWeight,
    linear,
    mkl_packing_available,
)

needs_mkl = pytest.mark.skipif(
    not mkl_packing_available(), reason="this torch build has no MKL packed GEMM"
)


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=needs_mkl)])
@settings(max_examples=40)
@given(
    lead=st.lists(st.integers(1, 70), min_size=1, max_size=2),
    in_features=st.sampled_from([1, 7, 64, 96]),
    out_features=st.sampled_from([1, 5, 128]),
    bias=st.booleans(),
    transposed_input=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_f_linear(
    packed, lead, in_features, out_features, bias, transposed_input, seed
) -> None:
    """Plain calls (transposed product inside its window) and calls with a pack under
    inference mode (packed from ``PACKED_MIN_ROWS`` rows) both equal ``F.linear``."""
    gen = torch.Generator().manual_seed(seed)
    if transposed_input:
        x = torch.randn(in_features, *lead, generator=gen).movedim(0, -1)
    else:
        x = torch.randn(*lead, in_features, generator=gen)
    w = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if bias else None
    pack = PackedWeight() if packed else None
    with torch.inference_mode():
        got = linear(x, w, b, pack=pack)
    if pack is not None:
        assert pack.is_packed == (math.prod(lead) >= PACKED_MIN_ROWS)
    want = F.linear(x, w, b)
    assert got.shape == want.shape
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_transposed_product_is_used_and_exact_in_value() -> None:
    """Inside the window the product is ``(W x^T)^T``; the result is a fresh contiguous tensor."""
    rows = CPU_TRANSPOSED_ROWS.start
    x = torch.randn(rows, 33)
    w = torch.randn(17, 33)
    torch.testing.assert_close(linear(x, w), torch.mm(w, x.t()).t(), rtol=0, atol=0)
    assert linear(x, w).view(-1).shape == (rows * 17,)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_falls_back_to_f_linear(dtype: torch.dtype) -> None:
    x = torch.randn(8, 16).to(dtype)
    w = torch.randn(4, 16).to(dtype)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_empty_inputs() -> None:
    assert linear(torch.empty(0, 8), torch.randn(3, 8)).shape == (0, 3)
    assert linear(torch.empty(5, 0), torch.randn(3, 0)).shape == (5, 3)


@pytest.mark.parametrize("rows", [1, 4, 16, 48, 64])
def test_non_contiguous_result_has_the_same_values(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 24, generator=gen)
    w = torch.randn(40, 24, generator=gen)
    b = torch.randn(40, generator=gen)
    got = linear(x, w, b, contiguous=False)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert got.is_contiguous() == (rows not in CPU_TRANSPOSED_ROWS)
    # A following projection of the transposed view equals one of a contiguous copy.
    w2 = torch.randn(8, 40, generator=gen)
    torch.testing.assert_close(
        linear(got, w2), F.linear(got.contiguous(), w2), rtol=1e-5, atol=1e-5
    )


@needs_mkl
def test_pack_follows_the_weight() -> None:
    """In-place changes and a new weight tensor are never served from a stale pack."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(32, 16, generator=gen)
    x = torch.randn(5, 16, generator=gen)
    pack = PackedWeight()
    with torch.no_grad():
        torch.testing.assert_close(linear(x, w, pack=pack), F.linear(x, w))
        w.mul_(-3.0)  # same storage, version counter moves
        torch.testing.assert_close(linear(x, w, pack=pack), F.linear(x, w))
        w2 = torch.randn(32, 16, generator=gen)
        torch.testing.assert_close(linear(x, w2, pack=pack), F.linear(x, w2))
        torch.testing.assert_close(linear(x, w, pack=pack), F.linear(x, w))
    pack.clear()
    assert not pack.is_packed


@needs_mkl
def test_autograd_takes_the_plain_path() -> None:
    """With autograd on the packed kernel (no backward) is not used and gradients flow."""
    w = torch.randn(8, 4, requires_grad=True)
    x = torch.randn(6, 4, requires_grad=True)
    pack = PackedWeight()
    linear(x, w, pack=pack).sum().backward()
    assert not pack.is_packed
    assert x.grad is not None and w.grad is not None
    torch.testing.assert_close(x.grad, w.sum(0).expand(6, 4).detach())


def test_pack_ignored_off_cpu_fp32() -> None:
    pack = PackedWeight()
    x, w = torch.randn(8, 16).bfloat16(), torch.randn(4, 16).bfloat16()
    with torch.inference_mode():
        assert torch.equal(linear(x, w, pack=pack), F.linear(x, w))
    assert not pack.is_packed
