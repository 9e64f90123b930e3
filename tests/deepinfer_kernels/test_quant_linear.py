"""``quant_linear`` (C kernel, dequantise + MKL, Triton interpreter) against the reference."""

from __future__ import annotations

import pytest
import torch
from _verify_cases import triton_device
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.quant import (
    GEMV_MAX_ROWS,
    QuantGemvKernel,
    QuantType,
    QuantWeight,
    dequantize,
    quant_linear,
)
from deepinfer_kernels.quant.ops import default_cpu_kernel, quant_linear_impl
from deepinfer_kernels.reference.quant import dequantize_reference
from deepinfer_kernels.testing.quant import product_tolerance, quant_weights, random_quant_rows


def _check_close(y: torch.Tensor, x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None):
    wf = dequantize_reference(w.data, w.qtype)
    want = x.double() @ wf.double().t()
    if bias is not None:
        want = want + bias.double()
    tol = product_tolerance(x, wf) + (0 if bias is None else 1.2e-7 * bias.abs()) + 1e-6
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], w.rows)
    assert ((y.double() - want).abs() <= tol.double()).all(), (y.double() - want).abs().max()


@settings(max_examples=25, deadline=None)
@given(
    w=quant_weights(),
    rows=st.sampled_from([1, 2, 3, 4, 5, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 3]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cpu_paths_match_reference(w: QuantWeight, rows: int, with_bias: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, w.cols, generator=g)
    bias = torch.randn(w.rows, generator=g) if with_bias else None
    _check_close(quant_linear(x, w, bias), x, w, bias)


@settings(max_examples=40, deadline=None)
@given(w=quant_weights(max_rows=37), rows=st.sampled_from([1, 2, 3, 4]), data=st.data())
def test_decode_rows_on_one_hot_inputs_return_the_dequantised_weights(
    w: QuantWeight, rows: int, data: st.DataObject
) -> None:
    """One to four x rows take the decode path (each block decoded once in registers for every
    row, a contiguous share of the output rows per thread, so odd row counts split unevenly;
    the K-quants at 3-4 rows take the panels): x = e_k must give column k of gguf's
    dequantised weight exactly, for every format and for a bias of zeros too."""
    if not default_cpu_kernel().available():
        pytest.skip("no C compiler")
    ks = data.draw(st.lists(st.integers(0, w.cols - 1), min_size=rows, max_size=rows))
    x = torch.zeros(rows, w.cols)
    x[range(rows), ks] = 1.0
    want = dequantize_reference(w.data, w.qtype)[:, ks].t()
    assert torch.equal(quant_linear(x, w), want)
    assert torch.equal(quant_linear(x, w, torch.zeros(w.rows)), want)


def test_leading_dims_and_strided_rows() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q6_K, 7, 512, seed=2), QuantType.Q6_K, 512)
    x = torch.randn(2, 3, 512)
    y = quant_linear(x, w)
    _check_close(y, x, w, None)
    wide = torch.randn(4, 600)[:, :512]  # rows with a stride wider than cols
    _check_close(quant_linear(wide, w), wide, w, None)


def test_c_kernel_agrees_with_the_dequantise_then_gemm_path() -> None:
    """Both CPU paths read the same weights: the fused GEMV for few rows, MKL for more."""
    if not default_cpu_kernel().available():
        pytest.skip("no C compiler")
    w = QuantWeight(random_quant_rows(QuantType.Q4_1, 64, 96, seed=4), QuantType.Q4_1, 96)
    x = torch.randn(GEMV_MAX_ROWS, 96)
    gemv = quant_linear(x, w)
    gemm = x @ dequantize(w).t()
    torch.testing.assert_close(gemv, gemm, rtol=1e-5, atol=1e-5)


def test_without_compiler_falls_back_to_reference(no_c_compiler: None, tmp_path) -> None:
    kernel = QuantGemvKernel(cache_dir=tmp_path / "kernels")
    with pytest.warns(RuntimeWarning, match="unavailable"):
        assert not kernel.available()
    assert not kernel.available()  # warns once, answers the same
    assert not QuantGemvKernel(enabled=False).available()


def test_bad_arguments_name_themselves() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q8_0, 4, 64, seed=0), QuantType.Q8_0, 64)
    with pytest.raises(ValueError, match="x: expected"):
        quant_linear(torch.randn(2, 63), w)
    with pytest.raises(TypeError, match="x:"):
        quant_linear(torch.ones(2, 64, dtype=torch.int64), w)
    with pytest.raises(ValueError, match="bias"):
        quant_linear(torch.randn(2, 64), w, torch.randn(5))
    with pytest.raises(TypeError, match="weight"):
        quant_linear(torch.randn(2, 64), w.data)  # type: ignore[arg-type]


def test_op_is_registered_with_a_fake_and_compiles() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q4_0, 8, 64, seed=5), QuantType.Q4_0, 64)
    x = torch.randn(3, 64)
    out = torch.ops.deepinfer.quant_linear(x, w.data, int(w.qtype), 64, None, False)
    torch.testing.assert_close(out, quant_linear_impl(x, w.data, int(w.qtype), 64, None, False))
    torch.library.opcheck(
        torch.ops.deepinfer.quant_linear.default, (x, w.data, int(w.qtype), 64, None, False)
    )
    compiled = torch.compile(lambda t: quant_linear(t, w) * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), quant_linear(x, w) * 2)


@settings(max_examples=10, deadline=None)
@given(
    w=quant_weights(max_rows=20, max_blocks=2),
    rows=st.sampled_from([1, 3, 17]),
    with_bias=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_triton_kernel_matches_reference(
    w: QuantWeight, rows: int, with_bias: bool, dtype: torch.dtype, seed: int
) -> None:
    pytest.importorskip("triton")
    dev = triton_device()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, w.cols, generator=g).to(dtype)
    bias = torch.randn(w.rows, generator=g) if with_bias else None
    y = quant_linear(
        x.to(dev), w.to(dev), None if bias is None else bias.to(dev), use_triton=True
    ).cpu()
    if dtype == torch.float32:
        _check_close(y, x, w, bias)
    else:  # fp32 accumulation, one rounding of the result to x's dtype
        want = x.float() @ dequantize_reference(w.data, w.qtype).t()
        if bias is not None:
            want = want + bias
        rtol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
        torch.testing.assert_close(y.float(), want, rtol=rtol, atol=rtol * want.abs().max())
