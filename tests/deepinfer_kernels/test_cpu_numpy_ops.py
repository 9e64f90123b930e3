"""The torch-free kernel calls (``cpu/numpy_ops.py``) against the torch wrappers of the same C
entries: same inputs, the same bits; property-based over shapes and GGUF types; bad operands
refused by name; and the package imports without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from _cpu import built
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.cpu import (
    AddRmsNorm,
    BlockRows,
    LayerBlockRows,
    LayerDims,
    LayerShape,
    NumpyKernels,
    PagedAttentionTiles,
    QuantDecoderLayerKernel,
)
from deepinfer_kernels.cpu.decode_tiles import plan_verify_tile
from deepinfer_kernels.cpu.sources import QUANT_GEMV
from deepinfer_kernels.quant import QuantGemvKernel, QuantType
from deepinfer_kernels.testing.quant import BLOCK_TYPES, FLOAT_TYPES, quant_weights
from deepinfer_kernels.testing.quant_layer import QuantLayerCase, quant_layer_cases


@pytest.fixture(scope="module")
def cache() -> Path | None:
    """The default kernel cache: builds there are atomic and locked (xdist-safe) and shared
    with the engine, so these tests compile nothing the suite has not compiled already."""
    return None


@pytest.fixture(scope="module")
def kernels(cache: Path | None) -> NumpyKernels:
    return built(NumpyKernels(cache, enabled=True))


def np_(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().numpy())


def same(got: np.ndarray, want: torch.Tensor) -> None:
    """Bit for bit (NaN payloads aside: none arise from these inputs)."""
    np.testing.assert_array_equal(got, want.numpy())


def test_the_quant_gemv_table_entry_matches_the_torch_wrapper() -> None:
    from deepinfer_kernels.quant.cpu import ABI, SOURCE

    assert QUANT_GEMV.abi_string() == ABI
    assert QUANT_GEMV.path.resolve() == SOURCE.resolve()


def test_importing_the_kernels_does_not_import_torch() -> None:
    code = (
        "import sys, numpy as np\n"
        "import deepinfer_kernels\n"
        "from deepinfer_kernels.cpu import NumpyKernels, load_openmp_runtime\n"
        "from deepinfer_kernels.quant.formats import row_bytes\n"
        "load_openmp_runtime()\n"
        "k = NumpyKernels()\n"
        "assert k.available(), k.unavailable_reason()\n"
        "k.add_rms_norm(np.ones((2, 8), np.float32), None, np.ones(8, np.float32), 1e-5)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


@settings(max_examples=30, deadline=None)
@given(w=quant_weights(max_rows=20), rows=st.integers(1, 24), bias=st.booleans(),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_linear_equals_the_torch_wrapper(
    kernels: NumpyKernels, cache: Path | None, w, rows: int, bias: bool, seed: int
) -> None:
    """The same C entry (``deepinfer_quant_linear``) at 1-24 rows: both product paths."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, w.cols, generator=gen)
    b = torch.randn(w.rows, generator=gen) if bias else None
    want = QuantGemvKernel(cache, enabled=True).linear(x, w.data, w.qtype, w.cols, b)
    block = BlockRows(np_(w.data).reshape(-1), ((w.qtype, w.rows),), w.cols)
    same(kernels.linear(np_(x), block, None if b is None else np_(b)), want)


@settings(max_examples=30, deadline=None)
@given(w=quant_weights(max_rows=12))
def test_dequantize_and_embed_equal_gguf(kernels: NumpyKernels, w) -> None:
    raw = np_(w.data)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(w.qtype)))
    got = kernels.dequantize(raw, w.qtype, w.cols)
    np.testing.assert_array_equal(got, np.asarray(want, np.float32).reshape(w.rows, w.cols))
    ids = np.array([w.rows - 1, 0, w.rows // 2, 0], dtype=np.int64)
    table = BlockRows(raw.reshape(-1), ((w.qtype, w.rows),), w.cols)
    np.testing.assert_array_equal(kernels.embed(table, ids), got[ids])


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 9), size=st.sampled_from([1, 8, 17, 64, 576]), delta=st.booleans(),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_add_rms_norm_equals_the_torch_wrapper(
    kernels: NumpyKernels, cache: Path | None, rows: int, size: int, delta: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    r, w = torch.randn(rows, size, generator=gen), torch.rand(size, generator=gen) + 0.5
    d = torch.randn(rows, size, generator=gen) if delta else None
    with torch.inference_mode():
        want = built(AddRmsNorm(cache, enabled=True))(r, d, w, 1e-5)
    got = kernels.add_rms_norm(np_(r), None if d is None else np_(d), np_(w), 1e-5)
    for g, t in zip(got, want):
        same(g, t)


def _layer(q: QuantLayerCase) -> tuple[LayerDims, LayerBlockRows]:
    c = q.case
    dims = LayerDims(c.hidden, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate)

    def rows(name: str) -> BlockRows:
        return BlockRows.of(*[(np_(w.data), w.qtype, w.cols) for w in q.parts[name]])

    bias = None if c.qkv_bias is None else np_(c.qkv_bias)
    return dims, LayerBlockRows(dims, rows("qkv"), bias, rows("o"), rows("gate_up"), rows("down"))


@settings(max_examples=20, deadline=None)
@given(q=quant_layer_cases(max_rows=20))
def test_layer_halves_equal_the_torch_kernel(
    kernels: NumpyKernels, cache: Path | None, q: QuantLayerCase
) -> None:
    """Both halves over mixed GGUF parts: QKV + RoPE + K/V write; o-proj + norms + MLP."""
    c = q.case
    dims, layer = _layer(q)
    shape = LayerShape(c.hidden, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate)
    torch_kernel = built(QuantDecoderLayerKernel(cache, enabled=True))
    k_t, v_t = c.k_cache.clone(), c.v_cache.clone()
    out_t = torch.empty(c.rows, shape.qkv_width)
    slots = torch_kernel.slot_mapping(c.slots, c.num_blocks * c.block_size)
    with torch.inference_mode():
        torch_kernel.qkv(c.x, q.blocks(), shape, c.cos, c.sin, slots, k_t, v_t, out_t)
    k_n, v_n = np_(c.k_cache).copy(), np_(c.v_cache).copy()
    out_n = np.empty((c.rows, dims.qkv_width), np.float32)
    slots_n = np_(c.slots.to(torch.int64))
    kernels.layer_qkv(np_(c.x), layer, np_(c.cos), np_(c.sin), slots_n, k_n, v_n, out_n)
    same(out_n, out_t)
    same(k_n, k_t)
    same(v_n, v_t)

    residual_t, normed_t = c.x.clone(), torch.empty_like(c.x)
    with torch.inference_mode():
        torch_kernel.mlp(c.attn, q.blocks(), shape, residual_t, normed_t, c.post_norm,
                         c.next_norm, c.eps, torch.empty(shape.scratch_size(c.rows)))  # fmt: skip
    residual_n, normed_n = np_(c.x).copy(), np.empty((c.rows, c.hidden), np.float32)
    scratch = np.empty(dims.scratch_size(c.rows), np.float32)
    kernels.layer_mlp(np_(c.attn), layer, residual_n, normed_n, np_(c.post_norm),
                      np_(c.next_norm), c.eps, scratch)  # fmt: skip
    same(residual_n, residual_t)
    same(normed_n, normed_t)


@settings(max_examples=25, deadline=None)
@given(
    kv=st.integers(1, 3), group=st.sampled_from([1, 3]), d=st.sampled_from([16, 32, 64]),
    block=st.sampled_from([1, 4, 16]), q_len=st.integers(1, 16), extra=st.integers(0, 70),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_attention_equals_the_torch_kernel(
    kernels: NumpyKernels, cache: Path | None, kv: int, group: int, d: int, block: int, q_len: int,
    extra: int, seed: int,
) -> None:  # fmt: skip
    """A causal tile of ``q_len`` queries (a prefill chunk or a decode row) over pages in a
    shuffled order, Q read out of a fused QKV row."""
    gen = torch.Generator().manual_seed(seed)
    hq, seq_len = kv * group, q_len + extra
    pages = -(-seq_len // block)
    num_blocks = pages + 3
    table = torch.randperm(num_blocks, generator=gen)[:pages].tolist()
    k_cache = torch.randn(num_blocks, block, kv, d, generator=gen)
    v_cache = torch.randn(num_blocks, block, kv, d, generator=gen)
    qkv = torch.randn(q_len, (hq + 2 * kv) * d, generator=gen)
    tile = plan_verify_tile(table, seq_len, q_len, block_size=block, num_blocks=num_blocks,
                            num_q_heads=hq)  # fmt: skip
    assert tile is not None
    scale = d**-0.5
    q_view = qkv.view(q_len, -1, d)[:, :hq]
    tiles = built(PagedAttentionTiles(cache, enabled=True))
    want, _ = tiles.run(
        q_view, k_cache, v_cache, page_ids=tile.page_ids, q_rows=None, row_start=0,
        keep=tile.keep, num_tiles=1, max_q=q_len, num_pages=tile.num_pages,
        key_len=tile.key_len, scale=scale, soft_cap=0.0, want_lse=False,
    )  # fmt: skip
    out = np.empty((q_len, hq, d), np.float32)
    keep = None if tile.keep is None else np_(tile.keep)
    kernels.attention(
        np_(qkv), hq, d, np_(k_cache), np_(v_cache), out, page_ids=np_(tile.page_ids),
        keep=keep, num_tiles=1, max_q=q_len, num_pages=tile.num_pages, key_len=tile.key_len,
        scale=scale,
    )  # fmt: skip
    same(out, want)


def test_bad_operands_are_refused_by_name(kernels: NumpyKernels) -> None:
    w = BlockRows(np.zeros(4 * 18, np.uint8), ((QuantType.Q4_0, 4),), 32)
    with pytest.raises(ValueError, match="x: expected a C-contiguous float32"):
        kernels.linear(np.zeros((2, 32), np.float64), w)
    with pytest.raises(ValueError, match="x: expected"):
        kernels.linear(np.zeros((2, 64), np.float32), w)
    with pytest.raises(ValueError, match="not contiguous"):
        kernels.linear(np.zeros((32, 2), np.float32).T, w)
    with pytest.raises(ValueError, match="bias"):
        kernels.linear(np.zeros((2, 32), np.float32), w, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="data: the layout holds"):
        BlockRows(np.zeros(10, np.uint8), ((QuantType.Q4_0, 4),), 32)
    with pytest.raises(ValueError, match="cols"):
        BlockRows(np.zeros(18, np.uint8), ((QuantType.Q4_0, 1),), 31)
    with pytest.raises(ValueError, match="ids"):
        kernels.embed(w, np.array([4]))
    with pytest.raises(ValueError, match="num_heads"):
        LayerDims(8, 3, 2, 4, 8)
    k = np.zeros((2, 4, 1, 16), np.float32)
    qkv = np.zeros((1, 48), np.float32)
    out = np.zeros((1, 1, 16), np.float32)
    kw = dict(keep=None, num_tiles=1, max_q=1, num_pages=1, key_len=4, scale=0.25)
    with pytest.raises(ValueError, match="page_ids"):
        kernels.attention(qkv, 1, 16, k, k.copy(), out, page_ids=np.array([2]), **kw)
    with pytest.raises(ValueError, match="key_len"):
        kernels.attention(qkv, 1, 16, k, k.copy(), out, page_ids=np.array([1]),
                          **{**kw, "key_len": 5})  # fmt: skip


@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_block_rows_join_parts_of_mixed_formats(qtype: QuantType) -> None:
    from deepinfer_kernels.cpu import BlockMatrix
    from deepinfer_kernels.quant import QuantWeight
    from deepinfer_kernels.testing.quant import random_quant_rows

    a = random_quant_rows(qtype, 3, 256, seed=1)
    b = random_quant_rows(QuantType.Q8_0, 2, 256, seed=2)
    rows = BlockRows.of((np_(a), qtype, 256), (np_(b), QuantType.Q8_0, 256))
    torch_rows = BlockMatrix.of(QuantWeight(a, qtype, 256), QuantWeight(b, QuantType.Q8_0, 256))
    assert rows.segments.tolist() == torch_rows.segments.tolist()
    np.testing.assert_array_equal(rows.data, torch_rows.data.numpy())
    assert rows.rows == 5 and [q for _, q in rows.parts()] == [qtype, QuantType.Q8_0]
