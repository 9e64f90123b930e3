"""The BF16 row path of the quantised product at 1-4 x rows (gguf_blocks.h ``bf16_rows_split``),
and F16 rows (the in-order register path: routed through the BF16 loop they measured no faster,
0.92x -> 0.93x the bf16 panels) under the same checks.

It reads 16 weights per 32-byte load as their even and odd halves and multiplies them with x
split the same way, so a wrong pairing of weight and activation would still give plausible
numbers: one-hot inputs pin every pairing exactly, random ones bound the fp32 rounding. Sizes
cover K below one 32-weight block, odd K (the scalar tail), and R * K past the split buffer
(32768 floats), where the in-order register path takes over.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.quant import QuantType, QuantWeight, quant_linear
from deepinfer_kernels.quant.ops import default_cpu_kernel
from deepinfer_kernels.testing.quant import product_tolerance

SPLIT_MAX_FLOATS = 32768  # BF16_SPLIT_MAX_FLOATS in gguf_blocks.h


@pytest.fixture(autouse=True)
def _compiled() -> None:
    if not default_cpu_kernel().available():
        pytest.skip("no C compiler")


HALF = {torch.bfloat16: QuantType.BF16, torch.float16: QuantType.F16}


def bf16_weight(
    rows: int, cols: int, seed: int, dtype: torch.dtype = torch.bfloat16
) -> tuple[QuantWeight, torch.Tensor]:
    """A BF16 (F16) weight over the bytes of a random bf16 (fp16) matrix, and its exact fp32
    values."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.randn(rows, cols, generator=g) * 0.05).to(dtype)
    return QuantWeight(values.view(torch.uint8), HALF[dtype], cols), values.float()


def check_close(y: torch.Tensor, x: torch.Tensor, wf: torch.Tensor, bias: torch.Tensor | None):
    want = x.double() @ wf.double().t()
    if bias is not None:
        want = want + bias.double()
    tol = product_tolerance(x, wf) + (0 if bias is None else 1.2e-7 * bias.abs()) + 1e-6
    assert y.shape == want.shape
    assert ((y.double() - want).abs() <= tol.double()).all(), (y.double() - want).abs().max()


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 37),
    cols=st.one_of(st.integers(1, 200), st.sampled_from([32, 64, 576, 1536])),
    x_rows=st.integers(1, 4),
    dtype=st.sampled_from(list(HALF)),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_one_hot_rows_return_each_weight_exactly(
    rows: int, cols: int, x_rows: int, dtype: torch.dtype, seed: int, data: st.DataObject
) -> None:
    """x = e_k gives column k of the weight bit for bit: each weight meets its own x[k]."""
    w, wf = bf16_weight(rows, cols, seed, dtype)
    ks = data.draw(st.lists(st.integers(0, cols - 1), min_size=x_rows, max_size=x_rows))
    x = torch.zeros(x_rows, cols)
    x[range(x_rows), ks] = 1.0
    assert torch.equal(quant_linear(x, w), wf[:, ks].t())
    assert torch.equal(quant_linear(x, w, torch.zeros(rows)), wf[:, ks].t())


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 37),
    cols=st.one_of(st.integers(1, 300), st.sampled_from([576, 1536])),
    x_rows=st.integers(1, 4),
    with_bias=st.booleans(),
    strided=st.booleans(),
    dtype=st.sampled_from(list(HALF)),
    seed=st.integers(0, 2**16),
)
def test_random_rows_match_the_float64_product(
    rows: int, cols: int, x_rows: int, with_bias: bool, strided: bool, dtype: torch.dtype, seed: int
) -> None:
    w, wf = bf16_weight(rows, cols, seed, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(x_rows, cols + 7 if strided else cols, generator=g)[:, :cols]
    bias = torch.randn(rows, generator=g) if with_bias else None
    check_close(quant_linear(x, w, bias), x, wf, bias)


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("x_rows", [1, 2, 3, 4])
def test_rows_past_the_split_buffer_take_the_in_order_path(x_rows: int, dtype: torch.dtype) -> None:
    """K = 8200: one x row fits the split buffer, four do not (4 * 8200 > 32768); both paths
    give the float64 product to fp32 rounding, and the same one-hot columns."""
    cols = 8200
    assert cols <= SPLIT_MAX_FLOATS < 4 * cols
    w, wf = bf16_weight(9, cols, seed=x_rows, dtype=dtype)
    x = torch.randn(x_rows, cols, generator=torch.Generator().manual_seed(7))
    check_close(quant_linear(x, w), x, wf, None)
    hot = torch.zeros(x_rows, cols)
    ks = [0, 31, 8191, 8199][:x_rows]
    hot[range(x_rows), ks] = 1.0
    assert torch.equal(quant_linear(hot, w), wf[:, ks].t())
