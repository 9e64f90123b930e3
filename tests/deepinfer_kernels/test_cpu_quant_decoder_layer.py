"""The block-format decoder layer (``QuantDecoderLayerKernel``, ``csrc/quant_decoder_layer.c``)
against its references, property-based over every GGUF type it runs, and its ops."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from _cpu import built
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu import BlockMatrix, LayerBlocks, LayerShape, QuantDecoderLayerKernel
from deepinfer_kernels.cpu import quant_layer_ops as ops
from deepinfer_kernels.quant import QuantType, QuantWeight
from deepinfer_kernels.reference import quant_decoder_mlp_reference, quant_decoder_qkv_reference
from deepinfer_kernels.testing.cpu import CPU_OP_TOLERANCES
from deepinfer_kernels.testing.quant import BLOCK_TYPES, FLOAT_TYPES, random_quant_rows
from deepinfer_kernels.testing.quant_layer import (
    QuantLayerCase,
    quant_layer_case,
    quant_layer_cases,
)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    atol, rtol = CPU_OP_TOLERANCES[torch.float32]
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    torch.testing.assert_close(got, want, atol=atol * scale, rtol=rtol)


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> QuantDecoderLayerKernel:
    return built(QuantDecoderLayerKernel(tmp_path_factory.mktemp("kernels"), enabled=True))


def _shape(q: QuantLayerCase) -> LayerShape:
    c = q.case
    return LayerShape(c.hidden, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate)


def _parts(q: QuantLayerCase, name: str) -> list[tuple[torch.Tensor, int]]:
    return [(w.data, int(w.qtype)) for w in q.parts[name]]


def _run_qkv(
    layer: QuantDecoderLayerKernel, q: QuantLayerCase
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    c, shape = q.case, _shape(q)
    k_cache, v_cache = c.k_cache.clone(), c.v_cache.clone()
    out = torch.empty(c.rows, shape.qkv_width)
    slots = layer.slot_mapping(c.slots, c.num_blocks * c.block_size)
    with torch.inference_mode():
        layer.qkv(c.x, q.blocks(), shape, c.cos, c.sin, slots, k_cache, v_cache, out)
    return out, k_cache, v_cache


def _check_qkv(q: QuantLayerCase, got: tuple[torch.Tensor, ...]) -> None:
    c = q.case
    want = quant_decoder_qkv_reference(
        c.x, _parts(q, "qkv"), c.qkv_bias, c.cos, c.sin, c.slots, c.k_cache, c.v_cache,
        c.num_heads, c.num_kv_heads,
    )  # fmt: skip
    for g, w in zip(got, want):
        close(g, w)


def _check_mlp(q: QuantLayerCase, residual: torch.Tensor, normed: torch.Tensor) -> None:
    c = q.case
    want_residual, want_normed = quant_decoder_mlp_reference(
        c.attn, _parts(q, "o"), c.x, c.post_norm, _parts(q, "gate_up"), _parts(q, "down"),
        c.next_norm, c.eps,
    )  # fmt: skip
    close(residual, want_residual)
    close(normed, want_normed)


def _run_mlp(layer: QuantDecoderLayerKernel, q: QuantLayerCase) -> tuple[torch.Tensor, ...]:
    c, shape = q.case, _shape(q)
    residual, normed = c.x.clone(), torch.empty_like(c.x)
    scratch = torch.empty(shape.scratch_size(c.rows))
    with torch.inference_mode():
        layer.mlp(c.attn, q.blocks(), shape, residual, normed, c.post_norm, c.next_norm, c.eps,
                  scratch)  # fmt: skip
    return residual, normed


@settings(max_examples=25, deadline=None)
@given(q=quant_layer_cases())
def test_qkv_matches_the_reference(layer: QuantDecoderLayerKernel, q: QuantLayerCase) -> None:
    """QKV over mixed GGUF parts, RoPE, K/V at the slots (other slots untouched)."""
    _check_qkv(q, _run_qkv(layer, q))


@settings(max_examples=25, deadline=None)
@given(q=quant_layer_cases())
def test_mlp_matches_the_reference(layer: QuantDecoderLayerKernel, q: QuantLayerCase) -> None:
    _check_mlp(q, *_run_mlp(layer, q))


# The fused register path takes 1 to 4 rows of Q4_0/Q4_1/Q8_0/F32/F16/BF16 (four accumulators
# per row at 1-2 rows, two at 3-4); the K-quants dequantise a row into a buffer first at 1-2
# rows and take the panels at 3-4: every type on every path.
@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_every_type_on_both_product_paths(
    layer: QuantDecoderLayerKernel, qtype: QuantType, rows: int
) -> None:
    # Every width a whole number of 256-weight super-blocks, so even the K-quants fit each part.
    q = quant_layer_case(rows, 256, 4, 2, 64, 256, qtype, seed=rows, bias=rows == 3)
    assert q.types() == {qtype}
    _check_qkv(q, _run_qkv(layer, q))
    _check_mlp(q, *_run_mlp(layer, q))


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_float_rows_of_any_width(
    layer: QuantDecoderLayerKernel, qtype: QuantType, rows: int
) -> None:
    """F32/F16/BF16 rows whose widths (40, 24, 3 x 8) are not multiples of 32: the fused loop's
    scalar tail."""
    q = quant_layer_case(rows, 40, 3, 1, 8, 24, qtype, seed=1)
    assert q.types() == {qtype}
    _check_qkv(q, _run_qkv(layer, q))
    _check_mlp(q, *_run_mlp(layer, q))


@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_values_are_the_formats_exactly(layer: QuantDecoderLayerKernel, qtype: QuantType) -> None:
    """One-hot activations read single weights: the kernel multiplies the dequantised values
    bit for bit (nothing rounds the weights on the way), on both product paths."""
    cols, ks = 256, [0, 1, 31, 32, 255]
    m = BlockMatrix.of(QuantWeight(random_quant_rows(qtype, 9, cols, int(qtype)), qtype, cols))
    want = m.dequantized()
    one_hot = torch.zeros(len(ks), cols)
    one_hot[range(len(ks)), ks] = 1.0
    # Fused 1, 2, 3 and 4 rows (buffered or panels for the K-quants), panels at 5.
    for lo, hi in ((0, 1), (1, 3), (2, 5), (1, 5), (0, len(ks))):
        got = _project(layer, m, one_hot[lo:hi])
        assert torch.equal(got, want[:, ks[lo:hi]].t()), (qtype.name, lo, hi)


def _project(layer: QuantDecoderLayerKernel, m: BlockMatrix, x: torch.Tensor) -> torch.Tensor:
    """``x m^T`` through the QKV half: ``m`` as the QKV of one Q, K and V head of ``m.rows / 3``
    values each, with RoPE tables cos 1, sin 0 (which leave the values as they are)."""
    d = m.rows // 3
    shape = LayerShape(m.cols, 1, 1, d, 0)
    blocks = LayerBlocks(m, None, m, m, m)
    cos, sin = torch.ones(x.shape[0], d), torch.zeros(x.shape[0], d)
    cache = torch.zeros(1, x.shape[0], 1, d)
    out = torch.empty(x.shape[0], 3 * d)
    slots = layer.slot_mapping(torch.arange(x.shape[0]), x.shape[0])
    with torch.inference_mode():
        layer.qkv(x.contiguous(), blocks, shape, cos, sin, slots, cache, cache.clone(), out)
    return out


@settings(max_examples=6, deadline=None)
@given(q=quant_layer_cases(max_rows=4))
def test_registered_ops_equal_their_references(q: QuantLayerCase) -> None:
    c, b = q.case, q.blocks()
    k_cache, v_cache = c.k_cache.clone(), c.v_cache.clone()
    out = ops.quant_decoder_layer_qkv_op(
        c.x, b.qkv.data, b.qkv.segments, c.qkv_bias, c.cos, c.sin, c.slots, k_cache, v_cache,
        c.num_heads, c.num_kv_heads,
    )  # fmt: skip
    _check_qkv(q, (out, k_cache, v_cache))
    residual = c.x.clone()
    normed = ops.quant_decoder_layer_mlp_op(
        c.attn, b.o.data, b.o.segments, residual, c.post_norm, b.gate_up.data,
        b.gate_up.segments, b.down.data, b.down.segments, c.next_norm, c.eps,
    )  # fmt: skip
    _check_mlp(q, residual, normed)


def test_registered_ops_pass_opcheck() -> None:
    q = quant_layer_case(3, 64, 2, 1, 16, 32, QuantType.Q4_1, seed=2, bias=True)
    c, b = q.case, q.blocks()
    qkv_args = (c.x, b.qkv.data, b.qkv.segments, c.qkv_bias, c.cos, c.sin, c.slots,
                c.k_cache.clone(), c.v_cache.clone(), c.num_heads, c.num_kv_heads)  # fmt: skip
    mlp_args = (c.attn, b.o.data, b.o.segments, c.x.clone(), c.post_norm, b.gate_up.data,
                b.gate_up.segments, b.down.data, b.down.segments, c.next_norm, c.eps)  # fmt: skip
    for op, args in ((ops.quant_decoder_layer_qkv_op, qkv_args),
                     (ops.quant_decoder_layer_mlp_op, mlp_args)):  # fmt: skip
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_bad_weights_are_named(layer: QuantDecoderLayerKernel) -> None:
    q = quant_layer_case(1, 64, 2, 1, 16, 32, QuantType.Q8_0)
    c, shape, b = q.case, _shape(q), q.blocks()
    out = torch.empty(1, shape.qkv_width)
    slots = layer.slot_mapping(c.slots, c.num_blocks * c.block_size)
    wrong = BlockMatrix.of(QuantWeight(random_quant_rows(QuantType.F32, 3, 32, 0), QuantType.F32,
                                       32))  # fmt: skip

    with pytest.raises(ValueError, match=r"blocks\.qkv"):
        layer.qkv(c.x, replace(b, qkv=wrong), shape, c.cos, c.sin, slots, c.k_cache, c.v_cache,
                  out)  # fmt: skip
    with pytest.raises(ValueError, match="data: the layout holds"):
        BlockMatrix(b.o.data[:-1], b.o.layout, b.o.cols)
    with pytest.raises(ValueError, match="cols"):
        BlockMatrix(b.o.data, ((QuantType.Q4_0, 1),), 33)
    with pytest.raises(ValueError, match="layout"):
        BlockMatrix(b.o.data, ((99, 1),), 32)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="segments"):
        BlockMatrix.from_segments(b.o.data, torch.tensor([2, 0, 1, 4]))


def test_segments_merge_adjacent_types_and_round_trip() -> None:
    a = QuantWeight(random_quant_rows(QuantType.Q4_1, 3, 64, 1), QuantType.Q4_1, 64)
    b = QuantWeight(random_quant_rows(QuantType.Q4_1, 2, 64, 2), QuantType.Q4_1, 64)
    c = QuantWeight(random_quant_rows(QuantType.Q8_0, 4, 64, 3), QuantType.Q8_0, 64)
    m = BlockMatrix.of(a, b, c)
    assert m.segments.tolist() == [2, 3, 5, 40, 8, 4, 68]
    again = BlockMatrix.from_segments(m.data, m.segments)
    assert torch.equal(again.dequantized(), m.dequantized())
    assert m.rows == 9 and again.cols == 64


def test_turned_off_kernel_is_unavailable(tmp_path: Path) -> None:
    assert not QuantDecoderLayerKernel(tmp_path, enabled=False).available()


# ---------------------------------------------------------------- more than two rows (panels)
# T > 2 rows take gguf_panel.h: panels of 12 weight rows dequantised into a tile, a 2 x 6
# micro-kernel over it. These row counts cover every micro-kernel tail (T mod 6 = 1..5, 0) and
# more than one x group; widths include rows whose length is not a multiple of 256 (or of 32
# for the float formats) and segments whose row counts are not multiples of 12 or of 2.
MULTI_ROWS = [3, 4, 5, 7, 8, 16, 17, 33]


@settings(max_examples=20, deadline=None)
@given(
    rows=st.sampled_from(MULTI_ROWS),
    hidden=st.sampled_from([32, 96, 256, 37]),
    inter=st.sampled_from([24, 64, 288]),
    head_dim=st.sampled_from([8, 16]),
    num_kv=st.integers(1, 2),
    group=st.integers(1, 3),
    part_types=st.lists(st.sampled_from(BLOCK_TYPES + FLOAT_TYPES), min_size=7, max_size=7),
    seed=st.integers(0, 2**20),
    bias=st.booleans(),
)
def test_multi_row_panels_match_the_reference(
    layer: QuantDecoderLayerKernel,
    rows: int,
    hidden: int,
    inter: int,
    head_dim: int,
    num_kv: int,
    group: int,
    part_types: list[QuantType],
    seed: int,
    bias: bool,
) -> None:
    """Mixed formats per part (a part whose width is not whole blocks of its drawn format is
    F32), so a fused QKV or gate/up joins segments of different formats and sizes."""
    names = ("q", "k", "v", "o", "gate", "up", "down")
    q = quant_layer_case(rows, hidden, num_kv * group, num_kv, head_dim, inter,
                         dict(zip(names, part_types)), seed=seed, bias=bias)  # fmt: skip
    _check_qkv(q, _run_qkv(layer, q))
    _check_mlp(q, *_run_mlp(layer, q))


@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [4, 17])
def test_every_type_on_the_panel_path(
    layer: QuantDecoderLayerKernel, qtype: QuantType, rows: int
) -> None:
    # Widths of whole 256-weight super-blocks (so the K-quants fit) and 288 (9 blocks of 32:
    # a row length that is not a multiple of 256 for the 32-weight formats).
    inter = 288 if qtype in (QuantType.Q4_0, QuantType.Q4_1, QuantType.Q8_0) else 256
    q = quant_layer_case(rows, 256, 4, 2, 64, inter, qtype, seed=rows, bias=True)
    assert q.types() == {qtype}
    _check_qkv(q, _run_qkv(layer, q))
    _check_mlp(q, *_run_mlp(layer, q))


@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_panel_path_multiplies_the_formats_exactly(
    layer: QuantDecoderLayerKernel, qtype: QuantType
) -> None:
    """One-hot activations over 3 to 17 rows through the panel path return gguf's dequantised
    weights bit for bit, for a weight of 15 rows (one full 12-row panel and an odd rest)."""
    cols = 256
    m = BlockMatrix.of(QuantWeight(random_quant_rows(qtype, 15, cols, int(qtype)), qtype, cols))
    want = m.dequantized()
    for rows in (3, 7, 17):
        ks = [(37 * i) % cols for i in range(rows)]
        one_hot = torch.zeros(rows, cols)
        one_hot[range(rows), ks] = 1.0
        got = _project(layer, m, one_hot)
        assert torch.equal(got, want[:, ks].t()), (qtype.name, rows)
