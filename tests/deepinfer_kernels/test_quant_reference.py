"""The GGUF block-format reference and the C dequantiser against the ``gguf`` package."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from deepinfer_kernels.quant import (
    BLOCK_GEOMETRY,
    QuantType,
    QuantWeight,
    dequantize,
    quant_type,
    row_bytes,
)
from deepinfer_kernels.quant.ops import default_cpu_kernel
from deepinfer_kernels.reference.quant import dequantize_reference, quant_linear_reference
from deepinfer_kernels.testing.quant import BLOCK_TYPES, random_quant_rows, raw_blocks


def _gguf(w: QuantWeight) -> np.ndarray:
    return gguf.quants.dequantize(w.data.numpy(), gguf.GGMLQuantizationType(int(w.qtype)))


def assert_bit_identical(got: np.ndarray, want: np.ndarray) -> None:
    """Same shape, NaN in the same places, every other value the same bits."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.parametrize("qtype", list(QuantType))
def test_type_ids_and_geometry_are_ggml_s(qtype: QuantType) -> None:
    gtype = gguf.GGMLQuantizationType[qtype.name]
    assert gtype.value == qtype.value
    assert gguf.GGML_QUANT_SIZES[gtype] == BLOCK_GEOMETRY[qtype]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf's numpy on NaN / inf scales
@settings(max_examples=40, deadline=None)
@given(raw_blocks())
def test_reference_is_bit_identical_to_gguf_on_random_bytes(w: QuantWeight) -> None:
    assert_bit_identical(dequantize_reference(w.data, w.qtype).numpy(), _gguf(w))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_every_type_bit_identical_on_many_blocks(qtype: QuantType) -> None:
    """Every byte value in every position: 512 random blocks per type, both implementations."""
    size = BLOCK_GEOMETRY[qtype][1]
    raw = np.random.default_rng(int(qtype)).integers(0, 256, (64, 8 * size), dtype=np.uint8)
    w = QuantWeight(torch.from_numpy(raw), qtype, 8 * BLOCK_GEOMETRY[qtype][0])
    want = _gguf(w)
    assert_bit_identical(dequantize_reference(w.data, qtype).numpy(), want)
    assert_bit_identical(dequantize(w).numpy(), want)  # the C kernel where it builds


@pytest.mark.parametrize("qtype", [QuantType.F32, QuantType.F16, QuantType.BF16])
def test_float_types_are_exact_casts(qtype: QuantType) -> None:
    raw = random_quant_rows(qtype, 5, 40, seed=3)
    w = QuantWeight(raw, qtype, 40)
    dtype = {QuantType.F32: torch.float32, QuantType.F16: torch.float16}.get(qtype, torch.bfloat16)
    want = raw.view(dtype).float()
    assert torch.equal(dequantize_reference(raw, qtype), want)
    assert torch.equal(dequantize(w), want)
    if qtype != QuantType.BF16:  # gguf's BF16 class takes whole rows only through quants API
        assert_bit_identical(dequantize(w).numpy(), _gguf(w))


def test_c_dequantiser_is_bit_identical_on_realistic_rows() -> None:
    if not default_cpu_kernel().available():
        pytest.skip("no C compiler")
    for qtype in BLOCK_TYPES:
        cols = 2 * BLOCK_GEOMETRY[qtype][0]
        w = QuantWeight(random_quant_rows(qtype, 33, cols, seed=int(qtype)), qtype, cols)
        assert_bit_identical(dequantize(w).numpy(), _gguf(w))


def test_quant_linear_reference_is_the_dequantised_product() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q4_K, 6, 256, seed=1), QuantType.Q4_K, 256)
    x, b = torch.randn(3, 256), torch.randn(6)
    want = x @ dequantize_reference(w.data, w.qtype).t() + b
    torch.testing.assert_close(quant_linear_reference(x, w.data, w.qtype, b), want)


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ValueError, match="qtype"):
        quant_type(7)  # Q5_0's neighbour slot: not a type this package runs
    with pytest.raises(ValueError, match="cols"):
        row_bytes(QuantType.Q4_K, 100)
    with pytest.raises(ValueError, match="data"):
        QuantWeight(torch.zeros(2, 17, dtype=torch.uint8), QuantType.Q4_0, 32)
    with pytest.raises(ValueError, match="data"):
        QuantWeight(torch.zeros(2, 18), QuantType.Q4_0, 32)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data"):
        dequantize_reference(torch.zeros(2, 17, dtype=torch.uint8), QuantType.Q4_0)
