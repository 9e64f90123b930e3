"""``NumpyKernels.linear(sgemm=...)``: the lean runtime's many-row products on numpy's OpenBLAS,
bit for bit the engine's torch wrapper of the same C entry (``deepinfer_quant_linear_sgemm``),
and the torch-free BLAS rule (``quant.blas_choice``) both runtimes share."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu.numpy_blocks import BlockRows
from deepinfer_kernels.cpu.numpy_ops import SGEMM_MIN_ROWS, NumpyKernels
from deepinfer_kernels.quant import GEMV_MAX_ROWS, QuantGemvKernel, QuantType, QuantWeight
from deepinfer_kernels.quant.blas_choice import BlasChoice, SingleThreadSgemm
from deepinfer_kernels.quant.dense_gemm import DenseGemm
from deepinfer_kernels.testing.quant import quant_weights, random_quant_rows


@pytest.fixture(scope="module")
def sgemm() -> SingleThreadSgemm:
    try:
        found = BlasChoice.resolve("openblas").in_region_sgemm()
    except ValueError:
        pytest.skip("numpy's BLAS is not OpenBLAS, or threadpoolctl is missing")
    if found is None:
        pytest.skip("numpy's OpenBLAS exports no ILP64 cblas_sgemm")
    return found


@pytest.fixture(scope="module")
def kernels() -> NumpyKernels:
    k = NumpyKernels()
    if not k.available():
        pytest.skip(f"compiled CPU kernels unavailable: {k.unavailable_reason()}")
    return k


def _rows(w: QuantWeight) -> BlockRows:
    return BlockRows(w.data.numpy().copy(), ((w.qtype, w.rows),), cols=w.cols)


@settings(max_examples=15, deadline=None)
@given(
    w=quant_weights(max_rows=40),
    rows=st.integers(GEMV_MAX_ROWS + 1, 300),
    threads=st.sampled_from([1, 2]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_numpy_sgemm_equals_the_torch_wrapper_bit_for_bit(
    sgemm: SingleThreadSgemm, kernels: NumpyKernels, w: QuantWeight, rows: int, threads: int,
    with_bias: bool, seed: int,
) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, w.cols), dtype=np.float32)
    b = rng.standard_normal(w.rows, dtype=np.float32) if with_bias else None
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)  # the OpenMP pool both wrappers' C entry splits over
        with sgemm.one_thread() as address:
            got = kernels.linear(x, _rows(w), b, sgemm=address)
            want = QuantGemvKernel().linear(
                torch.from_numpy(x), w.data, w.qtype, w.cols,
                None if b is None else torch.from_numpy(b), sgemm=address,
            )  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert got.dtype == np.float32 and got.shape == (rows, w.rows)
    np.testing.assert_array_equal(got, want.numpy())
    # Against the block kernels: the same fp32 products in another summation order.
    ref = (
        x.astype(np.float64)
        @ kernels.dequantize(_rows(w).data.reshape(w.rows, -1), w.qtype, w.cols)
        .astype(np.float64)
        .T
    )
    if b is not None:
        ref += b
    scale = (
        np.abs(x).astype(np.float64)
        @ np.abs(kernels.dequantize(_rows(w).data.reshape(w.rows, -1), w.qtype, w.cols))
        .astype(np.float64)
        .T
    )
    assert (np.abs(got - ref) <= 2e-6 * scale + 1e-5 * (1 + np.abs(ref))).all()


def test_mixed_formats_one_hot_rows_and_bad_addresses(
    sgemm: SingleThreadSgemm, kernels: NumpyKernels
) -> None:
    a = random_quant_rows(QuantType.Q4_K, 21, 256, seed=1).numpy()
    c = random_quant_rows(QuantType.Q6_K, 13, 256, seed=2).numpy()
    w = BlockRows.of((a, QuantType.Q4_K, 256), (c, QuantType.Q6_K, 256))
    dense = np.concatenate(
        [kernels.dequantize(a, QuantType.Q4_K, 256), kernels.dequantize(c, QuantType.Q6_K, 256)]
    )
    cols = np.arange(40) * 5
    hot = np.zeros((40, 256), np.float32)
    hot[np.arange(40), cols] = 1.0
    with sgemm.one_thread() as address:
        # One product per output element: the exact weights come back, both segments.
        np.testing.assert_array_equal(kernels.linear(hot, w, sgemm=address), dense[:, cols].T)
    for bad in (0, -3, True, 1.5):
        with pytest.raises(ValueError, match="sgemm"):
            kernels.linear(hot, w, sgemm=bad)  # type: ignore[arg-type]


def test_one_rule_for_both_runtimes() -> None:
    """The engine's DenseGemm and the lean runtime read the same choice; the row threshold
    is the engine's."""
    assert SGEMM_MIN_ROWS == GEMV_MAX_ROWS + 1
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        choice, engine = BlasChoice.resolve("auto", vendor), DenseGemm("auto", vendor)
        assert (choice.one, choice.many) == (engine.backend_for(1), engine.backend_for(2))
        assert (choice.sgemm is None) == (engine.in_region_sgemm() is None)
    assert BlasChoice.resolve("auto", "GenuineIntel").in_region_sgemm() is None
    assert BlasChoice.resolve("mkl").in_region_sgemm() is None
    with pytest.raises(ValueError, match="backend"):
        BlasChoice.resolve("atlas")


def test_the_choice_imports_no_torch() -> None:
    code = (
        "import sys; from deepinfer_kernels.quant.blas_choice import default_blas_choice; "
        "default_blas_choice().in_region_sgemm(); "
        "import deepinfer_kernels.cpu.numpy_ops; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
