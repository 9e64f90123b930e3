"""The C K-quant decoders (Q4_K, Q5_K, Q6_K; AVX2 where the CPU has it) against ``gguf``.

Each 32-weight sub-block is decoded by a 32-byte load, shifts and masks, so a wrong shift, a
carry across bytes or a scale taken for the wrong half of a sub-block would show on some
bytes only: random bytes in every position (finite scales, and scales that are any fp16 bit
pattern, inf and NaN included) must give gguf's values bit for bit, and the products on the
decoded rows (1-2 x rows, the decode path) the float64 product to fp32 rounding.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.quant import BLOCK_GEOMETRY, QuantType, QuantWeight, dequantize, quant_linear
from deepinfer_kernels.quant.ops import default_cpu_kernel
from deepinfer_kernels.testing.quant import product_tolerance, random_quant_rows

K_QUANTS = [QuantType.Q4_K, QuantType.Q5_K, QuantType.Q6_K]


@pytest.fixture(autouse=True)
def _compiled() -> None:
    if not default_cpu_kernel().available():
        pytest.skip("no C compiler")


def gguf_values(w: QuantWeight) -> np.ndarray:
    return gguf.quants.dequantize(w.data.numpy(), gguf.GGMLQuantizationType(int(w.qtype)))


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """NaN in the same places, every other value the same bits."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf's numpy on inf / NaN scales
@settings(max_examples=30, deadline=None)
@given(
    qtype=st.sampled_from(K_QUANTS),
    rows=st.integers(1, 9),
    blocks=st.integers(1, 3),
    finite=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_decoded_rows_are_gguf_bit_for_bit(
    qtype: QuantType, rows: int, blocks: int, finite: bool, seed: int
) -> None:
    cols = blocks * BLOCK_GEOMETRY[qtype][0]
    if finite:
        data = random_quant_rows(qtype, rows, cols, seed=seed)
    else:
        size = BLOCK_GEOMETRY[qtype][1]
        raw = np.random.default_rng(seed).integers(0, 256, (rows, blocks * size), dtype=np.uint8)
        data = torch.from_numpy(raw)
    w = QuantWeight(data, qtype, cols)
    assert_same_bits(dequantize(w).numpy(), gguf_values(w))


@settings(max_examples=20, deadline=None)
@given(
    qtype=st.sampled_from(K_QUANTS),
    rows=st.integers(1, 21),
    blocks=st.integers(1, 3),
    x_rows=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_decode_products_match_the_float64_product(
    qtype: QuantType, rows: int, blocks: int, x_rows: int, seed: int
) -> None:
    cols = blocks * BLOCK_GEOMETRY[qtype][0]
    w = QuantWeight(random_quant_rows(qtype, rows, cols, seed=seed), qtype, cols)
    wf = torch.from_numpy(gguf_values(w))
    x = torch.randn(x_rows, cols, generator=torch.Generator().manual_seed(seed))
    want = x.double() @ wf.double().t()
    got = quant_linear(x, w)
    tol = product_tolerance(x, wf) + 1e-6
    assert ((got.double() - want).abs() <= tol.double()).all()
