"""Block-format products of 5-16 rows (``quant/csrc/gguf_tile_rows.h``): the lanes path (13-16
rows, x rows as vector lanes, each block decoded once per call), the register groups (5-10
rows of Q4_0/Q4_1/Q8_0/F32/F16/BF16) and the panels they leave (11-12 rows, K-quants below 13),
through ``quant_linear`` and the decoder layer's QKV half, against gguf's dequantised weights
in float64."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from _cpu import built
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu import BlockMatrix, LayerBlocks, LayerShape, QuantDecoderLayerKernel
from deepinfer_kernels.quant import QuantType, QuantWeight, quant_linear
from deepinfer_kernels.quant.ops import default_cpu_kernel
from deepinfer_kernels.reference.quant import dequantize_reference
from deepinfer_kernels.testing.quant import (
    BLOCK_TYPES,
    FLOAT_TYPES,
    product_tolerance,
    quant_weights,
    random_quant_rows,
)

MANY_ROWS = st.integers(5, 16)
LANES_MIN_ROWS = 13  # TILE_LANES_MIN_ROWS of gguf_tile_rows.h


@pytest.fixture(autouse=True)
def _kernel_or_skip() -> None:
    if not default_cpu_kernel().available():
        pytest.skip("no C compiler")


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """``n`` OpenMP threads inside, each taking a contiguous share of the output rows (odd
    counts split unevenly); the process's thread count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _check_close(y: torch.Tensor, x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None):
    wf = dequantize_reference(w.data, w.qtype)
    want = x.double() @ wf.double().t() + (0 if bias is None else bias.double())
    tol = product_tolerance(x, wf) + (0 if bias is None else 1.2e-7 * bias.abs()) + 1e-6
    assert y.dtype == torch.float32 and y.shape == (*x.shape[:-1], w.rows)
    assert ((y.double() - want).abs() <= tol.double()).all(), (y.double() - want).abs().max()


@settings(max_examples=30, deadline=None)
@given(
    w=quant_weights(max_rows=40),
    rows=MANY_ROWS,
    with_bias=st.booleans(),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_many_rows_match_the_float64_product(
    w: QuantWeight, rows: int, with_bias: bool, threads: int, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, w.cols, generator=g)
    bias = torch.randn(w.rows, generator=g) if with_bias else None
    with torch_threads(threads):
        _check_close(quant_linear(x, w, bias), x, w, bias)


@settings(max_examples=30, deadline=None)
@given(
    w=quant_weights(max_rows=40), rows=MANY_ROWS, threads=st.sampled_from([1, 2]), data=st.data()
)
def test_one_hot_rows_return_the_weights_bit_for_bit(
    w: QuantWeight, rows: int, threads: int, data: st.DataObject
) -> None:
    """x = e_k gives column k of gguf's dequantised weight exactly, on both paths, with and
    without a bias of zeros."""
    ks = data.draw(st.lists(st.integers(0, w.cols - 1), min_size=rows, max_size=rows))
    x = torch.zeros(rows, w.cols)
    x[range(rows), ks] = 1.0
    want = dequantize_reference(w.data, w.qtype)[:, ks].t()
    with torch_threads(threads):
        assert torch.equal(quant_linear(x, w), want)
        assert torch.equal(quant_linear(x, w, torch.zeros(w.rows)), want)


def _fma_chain(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The lanes path's documented order in float64 emulation: per (t, n) one fp32 fused
    multiply-add chain over k from +0, then + bias. (A product of two fp32 values is exact in
    float64, so each step rounds once to fp32 unless the float64 sum itself rounded onto an
    fp32 tie: about one step in 2^29.)"""
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for k in range(x.shape[1]):
        prod = np.outer(x[:, k].astype(np.float64), w[:, k].astype(np.float64))
        acc = (prod + acc.astype(np.float64)).astype(np.float32)
    return acc + bias[None, :]


@pytest.mark.parametrize("qtype", [QuantType.F32, QuantType.Q4_1, QuantType.Q6_K], ids=str)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [LANES_MIN_ROWS, 16])
def test_lanes_sum_in_the_documented_order(qtype: QuantType, rows: int, threads: int) -> None:
    cols = 512 if qtype == QuantType.Q6_K else 96  # two TILE_KC slices for the K-quant
    w = QuantWeight(random_quant_rows(qtype, 15, cols, seed=rows), qtype, cols)
    g = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, cols, generator=g), torch.randn(15, generator=g)
    want = _fma_chain(x.numpy(), dequantize_reference(w.data, w.qtype).numpy(), bias.numpy())
    with torch_threads(threads):
        assert np.array_equal(quant_linear(x, w, bias).numpy(), want)


def test_strided_and_leading_dimension_rows() -> None:
    w = QuantWeight(random_quant_rows(QuantType.Q8_0, 21, 64, seed=3), QuantType.Q8_0, 64)
    wide = torch.randn(14, 80)[:, :64]  # rows 80 floats apart
    _check_close(quant_linear(wide, w), wide, w, None)
    x3 = torch.randn(2, 7, 64)  # 14 rows in two leading dims
    y3 = quant_linear(x3, w)
    assert torch.equal(y3, quant_linear(x3.reshape(14, 64), w).view(2, 7, 21))


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> QuantDecoderLayerKernel:
    return built(QuantDecoderLayerKernel(tmp_path_factory.mktemp("kernels"), enabled=True))


def _qkv_product(layer: QuantDecoderLayerKernel, m: BlockMatrix, x: torch.Tensor) -> torch.Tensor:
    """``x m^T`` through the decoder layer's QKV half (quant_decoder_layer.c): ``m`` as one Q, K
    and V head of ``m.rows / 3`` values each, RoPE tables cos 1, sin 0 (values unchanged)."""
    d = m.rows // 3
    cos, sin = torch.ones(x.shape[0], d), torch.zeros(x.shape[0], d)
    cache = torch.zeros(1, x.shape[0], 1, d)
    out = torch.empty(x.shape[0], 3 * d)
    slots = layer.slot_mapping(torch.arange(x.shape[0]), x.shape[0])
    with torch.inference_mode():
        layer.qkv(
            x.contiguous(), LayerBlocks(m, None, m, m, m), LayerShape(m.cols, 1, 1, d, 0),
            cos, sin, slots, cache, cache.clone(), out,
        )  # fmt: skip
    return out


@pytest.mark.parametrize("rows", [5, 10, 12, 13, 16])
@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_decoder_layer_products_of_5_to_16_rows(
    layer: QuantDecoderLayerKernel, qtype: QuantType, rows: int
) -> None:
    """Every format alone, and joined with a K-quant segment (a mixed QKV takes one path for
    all its segments), gives the float64 product and one-hot rows bit for bit."""
    cols = 256
    alone = BlockMatrix.of(QuantWeight(random_quant_rows(qtype, 9, cols, rows), qtype, cols))
    mixed = BlockMatrix.of(
        QuantWeight(random_quant_rows(qtype, 6, cols, rows), qtype, cols),
        QuantWeight(random_quant_rows(QuantType.Q6_K, 3, cols, rows), QuantType.Q6_K, cols),
    )
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, cols, generator=g)
    hot = torch.zeros(rows, cols)
    ks = torch.randint(0, cols, (rows,), generator=g)
    hot[range(rows), ks] = 1.0
    for m in (alone, mixed):
        wf = m.dequantized()
        got = _qkv_product(layer, m, x).double()
        tol = product_tolerance(x, wf).double() + 1e-6
        assert ((got - x.double() @ wf.double().t()).abs() <= tol).all(), (qtype.name, rows)
        assert torch.equal(_qkv_product(layer, m, hot), wf[:, ks].t()), (qtype.name, rows)
