"""``DenseGemm``: the many-row (prefill) GEMM of ``quant_linear`` on MKL or numpy's OpenBLAS."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.quant import GEMV_MAX_ROWS, QuantType, QuantWeight, dequantize, quant_linear
from deepinfer_kernels.quant.dense_gemm import DenseGemm, cpu_vendor
from deepinfer_kernels.testing.quant import product_tolerance, quant_weights, random_quant_rows


def _openblas_or_skip() -> DenseGemm:
    try:
        return DenseGemm("openblas")
    except ValueError:
        pytest.skip("numpy's BLAS is not OpenBLAS, or threadpoolctl is missing")


def _backends() -> list[DenseGemm]:
    out = [DenseGemm("mkl")]
    with contextlib.suppress(ValueError):  # numpy without OpenBLAS: MKL only
        out.append(DenseGemm("openblas"))
    return out


def _assert_close(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None):
    want = x.double() @ w.double().t() + (0 if b is None else b.double())
    tol = product_tolerance(x, w).double() + (0 if b is None else 1.2e-7 * b.abs().double())
    assert y.dtype == torch.float32 and y.shape == (*x.shape[:-1], w.shape[0])
    assert ((y.double() - want).abs() <= tol + 1e-6).all(), (y.double() - want).abs().max()


@settings(max_examples=20, deadline=None)
@given(
    rows=st.integers(GEMV_MAX_ROWS + 1, 300),
    n=st.integers(1, 70),
    k=st.integers(1, 130),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_backend_matches_the_float64_product(
    rows: int, n: int, k: int, with_bias: bool, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if with_bias else None
    for gemm in _backends():
        _assert_close(gemm(x, w, b), x, w, b)


def test_leading_dims_strided_rows_and_one_hot_exactness() -> None:
    w = torch.randn(33, 96)
    x3 = torch.randn(2, 19, 96)
    wide = torch.randn(21, 120)[:, :96]  # rows with a stride wider than cols
    hot = torch.zeros(40, 96)
    hot[torch.arange(40), torch.arange(40) * 2] = 1.0
    for gemm in _backends():
        _assert_close(gemm(x3, w, None), x3, w, None)
        _assert_close(gemm(wide, w, None), wide, w, None)
        # One product per output element: the weights come back exactly, whatever the order.
        assert torch.equal(gemm(hot, w, None), w[:, torch.arange(40) * 2].t())


def test_openblas_and_mkl_agree_on_a_block_format_prefill() -> None:
    openblas = _openblas_or_skip()
    w = QuantWeight(random_quant_rows(QuantType.Q4_1, 96, 256, seed=3), QuantType.Q4_1, 256)
    wf = dequantize(w)
    x = torch.randn(77, 256)
    torch.testing.assert_close(openblas(x, wf, None), DenseGemm("mkl")(x, wf, None))


@settings(max_examples=12, deadline=None)
@given(
    w=quant_weights(max_rows=40),
    rows=st.integers(GEMV_MAX_ROWS + 1, 64),
    threads=st.sampled_from([1, 2]),
    with_bias=st.booleans(),
    data=st.data(),
)
def test_quant_linear_past_the_gemv_rows(
    w: QuantWeight, rows: int, threads: int, with_bias: bool, data: st.DataObject
) -> None:
    """More than ``GEMV_MAX_ROWS`` rows, at 1 and 2 threads: within fp32 rounding of the
    float64 product of gguf's values (on OpenBLAS each thread dequantises and multiplies its
    share of the rows), and one-hot rows return the dequantised weights bit for bit."""
    wf = dequantize(w)
    x = torch.randn(rows, w.cols)
    b = torch.randn(w.rows) if with_bias else None
    ks = data.draw(st.lists(st.integers(0, w.cols - 1), min_size=rows, max_size=rows))
    hot = torch.zeros(rows, w.cols)
    hot[range(rows), ks] = 1.0
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        _assert_close(quant_linear(x, w, b), x, wf, b)
        assert torch.equal(quant_linear(hot, w), wf[:, ks].t())
    finally:
        torch.set_num_threads(before)


def test_in_region_sgemm_keeps_openblas_at_one_thread_only_inside() -> None:
    gemm = DenseGemm("openblas")
    sgemm = gemm.in_region_sgemm()
    if sgemm is None:
        pytest.skip("numpy's OpenBLAS exports no ILP64 cblas_sgemm")
    controller = gemm._openblas
    controller.set_num_threads(2)
    with sgemm.one_thread() as address:
        assert address == sgemm.address != 0
        assert controller.get_num_threads() == 1
    assert controller.get_num_threads() == 2
    assert DenseGemm("mkl").in_region_sgemm() is None


def test_openblas_follows_torch_thread_count() -> None:
    gemm = _openblas_or_skip()
    before = torch.get_num_threads()
    x, w = torch.randn(20, 32), torch.randn(8, 32)
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            gemm(x, w, None)
            assert gemm._openblas.get_num_threads() == threads  # type: ignore[union-attr]
        # The limit is process-wide: moved by someone else, it is set back at the next call.
        gemm._openblas.set_num_threads(2)  # type: ignore[union-attr]
        gemm(x, w, None)
        assert gemm._openblas.get_num_threads() == 1  # type: ignore[union-attr]
    finally:
        torch.set_num_threads(before)


def test_auto_choice_is_fixed_by_the_cpu_vendor_and_thread_count() -> None:
    intel = DenseGemm("auto", vendor="GenuineIntel")
    assert (intel.backend_for(1), intel.backend_for(2)) == ("mkl", "mkl")
    amd = DenseGemm("auto", vendor="AuthenticAMD")
    has_openblas = len(_backends()) == 2
    assert amd.backend_for(1) == ("openblas" if has_openblas else "mkl")
    assert amd.backend_for(2) == "mkl"  # MKL shares torch's thread pool
    assert {DenseGemm("mkl").backend_for(t) for t in (1, 4)} == {"mkl"}
    if has_openblas:
        assert {DenseGemm("openblas").backend_for(t) for t in (1, 4)} == {"openblas"}


def test_bad_backend_names_the_argument() -> None:
    with pytest.raises(ValueError, match="backend: expected one of auto, mkl, openblas"):
        DenseGemm("blis")


def test_cpu_vendor_reads_cpuinfo(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert cpu_vendor(info) == "AuthenticAMD"
    assert cpu_vendor(tmp_path / "missing") == ""
