"""Hypothesis strategy for the block-format decoder layer (``QuantDecoderLayerKernel``).

``quant_layer_cases()`` draws a :class:`~deepinfer_kernels.testing.cpu.DecoderLayerCase`
(shapes, activations, RoPE tables, caches, slots) whose widths suit block formats, and gives
each projection part (Q, K, V, O, gate, up, down) its own GGUF type, so fused QKV and gate/up
matrices mix formats as llama.cpp's mixed quantisations do. Widths that are not a whole number
of blocks take float formats only (F32/F16/BF16 rows may have any width).

Example::

    @given(quant_layer_cases())
    def test_layer(case):
        blocks = case.blocks()  # LayerBlocks for the kernel
        dense = case.dense      # the same weights as fp32 matrices, for the reference
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from deepinfer_kernels.cpu.quant_decoder_layer import BlockMatrix, LayerBlocks
from deepinfer_kernels.quant.formats import BLOCK_GEOMETRY, QuantType, QuantWeight
from deepinfer_kernels.reference.quant import dequantize_reference
from deepinfer_kernels.testing.cpu import DecoderLayerCase
from deepinfer_kernels.testing.quant import BLOCK_TYPES, FLOAT_TYPES, random_quant_rows

ALL_TYPES = BLOCK_TYPES + FLOAT_TYPES


@dataclass
class QuantLayerCase:
    """A layer case whose projections are GGUF row segments (``parts``), and the same weights
    as fp32 matrices in ``case`` (``qkv_weight`` ... ``down_weight`` replaced)."""

    case: DecoderLayerCase
    parts: dict[str, list[QuantWeight]]

    def blocks(self) -> LayerBlocks:
        m = {name: BlockMatrix.of(*ws) for name, ws in self.parts.items()}
        return LayerBlocks(m["qkv"], self.case.qkv_bias, m["o"], m["gate_up"], m["down"])

    def types(self) -> set[QuantType]:
        return {w.qtype for ws in self.parts.values() for w in ws}


def _fitting(types: tuple[QuantType, ...], cols: int) -> list[QuantType]:
    """The types of ``types`` whose rows of ``cols`` weights are whole blocks (F32 if none)."""
    return [t for t in types if cols % BLOCK_GEOMETRY[t][0] == 0] or [QuantType.F32]


def quant_layer_case(
    rows: int,
    hidden: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate: int,
    types: dict[str, QuantType] | QuantType,
    seed: int = 0,
    bias: bool = False,
    block_size: int = 4,
) -> QuantLayerCase:
    """One case, built directly. ``types``: one type for every part, or a type per part name
    (``q k v o gate up down``); a part whose width is not whole blocks of its type is F32."""
    names = ("q", "k", "v", "o", "gate", "up", "down")
    chosen = {n: types for n in names} if isinstance(types, QuantType) else types
    gen = torch.Generator().manual_seed(seed)
    q_width = num_heads * head_dim
    shapes = {
        "q": (q_width, hidden), "k": (num_kv_heads * head_dim, hidden),
        "v": (num_kv_heads * head_dim, hidden), "o": (hidden, q_width),
        "gate": (intermediate, hidden), "up": (intermediate, hidden),
        "down": (hidden, intermediate),
    }  # fmt: skip
    made: dict[str, QuantWeight] = {}
    for i, (name, (n, k)) in enumerate(shapes.items()):
        qtype = chosen[name] if chosen[name] in _fitting((chosen[name],), k) else QuantType.F32
        made[name] = QuantWeight(random_quant_rows(qtype, n, k, seed * 7 + i, 0.05), qtype, k)
    parts = {
        "qkv": [made["q"], made["k"], made["v"]], "o": [made["o"]],
        "gate_up": [made["gate"], made["up"]], "down": [made["down"]],
    }  # fmt: skip
    dense = {
        name: torch.cat([dequantize_reference(w.data, w.qtype) for w in ws])
        for name, ws in parts.items()
    }
    width = (num_heads + 2 * num_kv_heads) * head_dim
    num_blocks = -(-(rows + 3) // block_size)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 6.3
    case = DecoderLayerCase(
        rows=rows,
        hidden=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        block_size=block_size,
        num_blocks=num_blocks,
        x=torch.randn(rows, hidden, generator=gen),
        qkv_weight=dense["qkv"],
        qkv_bias=torch.randn(width, generator=gen) if bias else None,
        o_weight=dense["o"],
        gate_up_weight=dense["gate_up"],
        down_weight=dense["down"],
        post_norm=torch.rand(hidden, generator=gen) + 0.5,
        next_norm=torch.rand(hidden, generator=gen) + 0.5,
        cos=torch.cat([angles.cos(), angles.cos()], dim=-1),
        sin=torch.cat([-angles.sin(), angles.sin()], dim=-1),
        slots=torch.randperm(num_blocks * block_size, generator=gen)[:rows],
        k_cache=torch.randn(cache_shape, generator=gen),
        v_cache=torch.randn(cache_shape, generator=gen),
        attn=torch.randn(rows, q_width, generator=gen),
        eps=1e-5,
    )
    return QuantLayerCase(case, parts)


@st.composite
def quant_layer_cases(
    draw: st.DrawFn, max_rows: int = 32, types: tuple[QuantType, ...] = ALL_TYPES
) -> QuantLayerCase:
    """A :class:`QuantLayerCase` of drawn sizes, each part of a drawn type of ``types`` that
    fits its width (F32 where none does). Rows 1 and 2 (the fused register path) are drawn
    as often as all the others."""
    rows = draw(st.one_of(st.integers(1, 2), st.integers(1, max_rows))) if max_rows > 1 else 1
    num_kv = draw(st.integers(1, 2))
    num_heads = num_kv * draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([8, 16, 32, 64]))
    hidden = draw(st.sampled_from([32, 64, 256, 40]))
    inter = draw(st.sampled_from([32, 256, 24]))
    widths = {"q": hidden, "k": hidden, "v": hidden, "o": num_heads * head_dim,
              "gate": hidden, "up": hidden, "down": inter}  # fmt: skip
    chosen = {n: draw(st.sampled_from(_fitting(types, k))) for n, k in widths.items()}
    return quant_layer_case(
        min(rows, max_rows), hidden, num_heads, num_kv, head_dim, inter, chosen,
        seed=draw(st.integers(0, 2**20)), bias=draw(st.booleans()),
        block_size=draw(st.sampled_from([1, 4, 16])),
    )  # fmt: skip
