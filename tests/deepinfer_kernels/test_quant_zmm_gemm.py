"""The many-row (prefill) block-format product on AVX-512 (``quant/csrc/gguf_zmm_gemm.h``,
run by ``deepinfer_quant_linear_sgemm`` in place of the OpenBLAS sgemm where the kernel is built
with AVX-512): against gguf's dequantised weights in float64, at the edges of its 8-row tiles,
2 x 16-column panels and 128-row chunks, every GGUF type, 1 and 2 threads; and the fused
SwiGLU (``quant_swiglu``: gate, up and ``silu(g) * u`` in one pass) against float64."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu.build import _cpu_flags
from deepinfer_kernels.quant import (
    GEMV_MAX_ROWS,
    QuantType,
    QuantWeight,
    dequantize,
    quant_swiglu,
)
from deepinfer_kernels.quant.dense_gemm import DenseGemm
from deepinfer_kernels.quant.ops import default_cpu_kernel
from deepinfer_kernels.reference.quant import quant_swiglu_reference
from deepinfer_kernels.testing.quant import (
    BLOCK_TYPES,
    FLOAT_TYPES,
    product_tolerance,
    quant_weights,
    random_quant_rows,
    swiglu_tolerance,
)

# Row counts at the tile (8), chunk (128) and GEMV_MAX_ROWS edges.
EDGE_ROWS = st.sampled_from([17, 21, 23, 24, 25, 127, 128, 129, 136, 257])


def _product(
    x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None, force_sgemm: bool = False
) -> torch.Tensor:
    """``deepinfer_quant_linear_sgemm`` as ``quant_linear`` calls it for many rows with
    OpenBLAS chosen: the kernel under test runs in the sgemm's place on AVX-512 builds (the
    sgemm itself elsewhere); ``force_sgemm``: the sgemm path on every build."""
    if not default_cpu_kernel().available():
        pytest.skip("no C compiler")
    try:
        sgemm = DenseGemm("openblas").in_region_sgemm()
    except ValueError:
        sgemm = None
    if sgemm is None:
        pytest.skip("numpy's OpenBLAS exports no ILP64 cblas_sgemm")
    with sgemm.one_thread() as address:
        kernel = default_cpu_kernel()
        return kernel.linear(x, w.data, w.qtype, w.cols, bias, address, force_sgemm=force_sgemm)


def _assert_close(y: torch.Tensor, x: torch.Tensor, w: QuantWeight, b: torch.Tensor | None):
    wf = dequantize(w)
    want = x.double() @ wf.double().t() + (0 if b is None else b.double())
    tol = product_tolerance(x, wf).double() + (0 if b is None else 1.2e-7 * b.abs().double())
    assert y.dtype == torch.float32 and y.shape == (x.shape[0], w.rows)
    assert ((y.double() - want).abs() <= tol + 1e-6).all(), (y.double() - want).abs().max()


@settings(max_examples=25, deadline=None)
@given(
    w=quant_weights(max_rows=70, max_blocks=2),
    rows=EDGE_ROWS,
    threads=st.sampled_from([1, 2]),
    with_bias=st.booleans(),
    wide=st.booleans(),
    force_sgemm=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_the_float64_product_at_tile_and_chunk_edges(
    w: QuantWeight,
    rows: int,
    threads: int,
    with_bias: bool,
    wide: bool,
    force_sgemm: bool,
    seed: int,
) -> None:
    """Both paths of the entry: the kernel's GEMM (AVX-512 builds) and the sgemm it replaced
    (``force_sgemm``, or a build without AVX-512)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, w.cols + (5 if wide else 0), generator=g)[:, : w.cols]
    b = torch.randn(w.rows, generator=g) if with_bias else None
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        _assert_close(_product(x, w, b, force_sgemm), x, w, b)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("force_sgemm", [False, True], ids=["default", "force_sgemm"])
@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda q: q.name)
def test_every_format_with_odd_panels_and_rows(qtype: QuantType, force_sgemm: bool) -> None:
    """47 output rows (two whole panels and a partial third: an odd panel count per thread
    at 2 threads) and 131 x rows (a partial chunk ending in a 3-row tile)."""
    cols = 256 * 2 if qtype.name.endswith("_K") else 96
    w = QuantWeight(random_quant_rows(qtype, 47, cols, seed=int(qtype)), qtype, cols)
    x = torch.randn(131, cols)
    b = torch.randn(47)
    for threads in (1, 2):
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(threads)
            _assert_close(_product(x, w, b, force_sgemm), x, w, b)
        finally:
            torch.set_num_threads(before)


def _floats(address: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The fp32 matrix ``[rows, cols]`` with row stride ``ld`` at ``address`` (a view)."""
    ptr = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
    flat = np.ctypeslib.as_array(ptr, shape=((rows - 1) * ld + cols,))
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (ld * 4, 4))


SGEMM64 = ctypes.CFUNCTYPE(
    None, *[ctypes.c_int] * 3, *[ctypes.c_int64] * 3, ctypes.c_float, ctypes.c_void_p,
    ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p,
    ctypes.c_int64,
)  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
def test_force_sgemm_runs_the_given_sgemm_and_the_default_only_without_own_gemm(
    threads: int,
) -> None:
    """An sgemm written here (row-major ``C = A B^T``, recording its calls) stands in for
    OpenBLAS: ``force_sgemm`` calls it for every output column on every build; the default
    calls it only where the kernel has no GEMM of its own (``own_gemm()``), so the flag is
    what lets an AVX-512 machine test the sgemm path."""
    kernel = default_cpu_kernel()
    if not kernel.available():
        pytest.skip("no C compiler")
    calls: list[tuple[int, int, int]] = []

    def sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):  # type: ignore[no-untyped-def]
        assert (order, ta, tb, alpha, beta) == (101, 111, 112, 1.0, 0.0)
        calls.append((m, n, k))
        _floats(c, m, n, ldc)[:] = _floats(a, m, k, lda) @ _floats(b, n, k, ldb).T

    callback = SGEMM64(sgemm)  # kept alive for the calls below
    address = ctypes.cast(callback, ctypes.c_void_p).value
    w = QuantWeight(random_quant_rows(QuantType.Q8_0, 37, 64, seed=3), QuantType.Q8_0, 64)
    x, b = torch.randn(GEMV_MAX_ROWS + 4, 64), torch.randn(37)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        forced = kernel.linear(x, w.data, w.qtype, w.cols, b, address, force_sgemm=True)
        assert calls and sum(n for _, n, _ in calls) == 37
        assert all(m == x.shape[0] and k == 64 for m, _, k in calls)
        _assert_close(forced, x, w, b)
        calls.clear()
        default = kernel.linear(x, w.data, w.qtype, w.cols, b, address)
    finally:
        torch.set_num_threads(before)
    assert bool(calls) != kernel.own_gemm()
    _assert_close(default, x, w, b)
    with pytest.raises(ValueError, match="force_sgemm"):
        kernel.linear(x, w.data, w.qtype, w.cols, b, None, force_sgemm=True)


@pytest.mark.skipif("avx512f" not in _cpu_flags().split(), reason="AVX-512 builds only")
def test_avx512_builds_have_their_own_gemm() -> None:
    if not default_cpu_kernel().available():
        pytest.skip("no C compiler")
    assert default_cpu_kernel().own_gemm()


def test_one_hot_rows_return_the_weights_exactly() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q4_1, 40, 128, seed=5), QuantType.Q4_1, 128)
    wf = dequantize(w)
    ks = torch.arange(GEMV_MAX_ROWS + 9) * 5 % 128
    hot = torch.zeros(len(ks), 128)
    hot[torch.arange(len(ks)), ks] = 1.0
    assert torch.equal(_product(hot, w, None), wf[:, ks].t())


@pytest.mark.skipif("avx512f" not in _cpu_flags().split(), reason="AVX-512 path only")
def test_a_rows_output_does_not_depend_on_its_neighbours() -> None:
    """On AVX-512 each output is one fma chain over k whatever the tile or chunk it falls in:
    a row gives the same bits among 200 rows as among 23 (the sgemm gave no such promise)."""
    w = QuantWeight(random_quant_rows(QuantType.Q4_0, 50, 192, seed=9), QuantType.Q4_0, 192)
    x = torch.randn(200, 192)
    whole = _product(x, w, None)
    part = _product(x[130:153].contiguous(), w, None)
    assert torch.equal(whole[130:153], part)


def _swiglu_reference(x: torch.Tensor, w: QuantWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``quant_swiglu_reference`` and its fp32-rounding bound (``swiglu_tolerance``)."""
    want = quant_swiglu_reference(x.double(), w.data, w.qtype)
    return want, swiglu_tolerance(x, dequantize(w))


@settings(max_examples=25, deadline=None)
@given(
    w=quant_weights(max_rows=35, max_blocks=2),
    rows=EDGE_ROWS,
    threads=st.sampled_from([1, 2]),
    wide=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_swiglu_matches_the_float64_reference(
    w: QuantWeight, rows: int, threads: int, wide: bool, seed: int
) -> None:
    """``quant_swiglu`` on gate-and-up weights of every format (twice the drawn rows: gate and
    up), at the tile and chunk edges, rows wider than the weight's cols, 1 and 2 threads."""
    both = QuantWeight(torch.cat([w.data, w.data.flip(0)]), w.qtype, w.cols)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, w.cols + (3 if wide else 0), generator=g)[:, : w.cols]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            got = quant_swiglu(x, both)
    finally:
        torch.set_num_threads(before)
    if got is None:
        pytest.skip("no fused path here (no AVX-512 or OpenBLAS)")
    want, tol = _swiglu_reference(x, both)
    assert got.shape == (rows, w.rows) and got.dtype == torch.float32
    assert ((got.double() - want).abs() <= tol).all(), (got.double() - want).abs().max()


def test_swiglu_declines_where_it_does_not_apply_and_names_bad_arguments() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q4_1, 8, 64, seed=1), QuantType.Q4_1, 64)
    few = torch.randn(GEMV_MAX_ROWS, 64)
    assert quant_swiglu(few, w) is None  # the decode step's rows: the fused decoder layer's
    grad = torch.randn(40, 64, requires_grad=True)
    assert quant_swiglu(grad, w) is None
    odd = QuantWeight(random_quant_rows(QuantType.Q4_1, 7, 64, seed=1), QuantType.Q4_1, 64)
    with pytest.raises(ValueError, match="weight"):
        quant_swiglu(torch.randn(40, 64), odd)
    with pytest.raises(ValueError, match="x"):
        quant_swiglu(torch.randn(40, 32), w)
