"""``torch.ops.deepinfer.dspark_greedy_draft``: the compiled greedy block of
:class:`~deepinfer_kernels.cpu.dspark_draft.DSparkDraftKernel` as a registered op over the
kernel's packed operands (``op_args``), with its fake and its torch fallback."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from deepinfer_kernels.cpu.bf16_weight_linear import unpack_panels
from deepinfer_kernels.cpu.dspark_reference import dspark_greedy_draft_reference
from deepinfer_kernels.cpu.dspark_weights import DraftBlockWeights, DraftLayerWeights
from deepinfer_kernels.cpu.native import NativeFunction
from deepinfer_kernels.cpu.sources import DSPARK_DRAFT
from deepinfer_kernels.quant.formats import QuantType, QuantWeight

__all__ = ["PackedOperands", "address", "dspark_greedy_draft_op", "op_reference"]


def address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class PackedOperands(NamedTuple):
    """The packed ``(weights, scalars)`` of ``DSparkDraftKernel.op_args`` read back: the
    per-layer tensors (six a layer), the shared tensors and the shape, format and norms."""

    layers: int
    num_heads: int
    num_kv_heads: int
    intermediate: int
    qtype: int
    cols: int
    eps: float
    head_eps: float
    conf_b: float
    per_layer: list[torch.Tensor]
    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    head_norm: torch.Tensor
    head_data: torch.Tensor
    markov_in: torch.Tensor
    markov_out: torch.Tensor
    vocab: torch.Tensor
    conf_w: torch.Tensor

    @classmethod
    def unpack(cls, weights: list[torch.Tensor], scalars: list[float]) -> PackedOperands:
        layers, hq, hkv, inter, qtype, cols = (int(v) for v in scalars[:6])
        eps, head_eps, conf_b = scalars[6:9]
        per_layer = weights[: 6 * layers]
        return cls(layers, hq, hkv, inter, qtype, cols, eps, head_eps, conf_b, per_layer,
                   *weights[6 * layers :])  # fmt: skip


def op_reference(
    anchor_embed: torch.Tensor,
    anchor_ids: torch.Tensor,
    context: torch.Tensor,
    valid: torch.Tensor | None,
    num_tokens: int,
    weights: list[torch.Tensor],
    scalars: list[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``deepinfer::dspark_greedy_draft`` without the C function: the packed operands unpacked
    into :func:`dspark_greedy_draft_reference`."""
    o = PackedOperands.unpack(weights, scalars)
    hq, hkv, per_layer = o.num_heads, o.num_kv_heads, o.per_layer
    hidden = int(o.mask.shape[1])
    block = DraftBlockWeights(
        mask_embed=o.mask,
        layers=tuple(
            DraftLayerWeights(
                per_layer[6 * i],
                unpack_panels(per_layer[6 * i + 1], (hq + 2 * hkv) * (hidden // hq)),
                unpack_panels(per_layer[6 * i + 2], hidden),
                per_layer[6 * i + 3],
                unpack_panels(per_layer[6 * i + 4], 2 * o.intermediate),
                unpack_panels(per_layer[6 * i + 5], hidden),
            )
            for i in range(o.layers)
        ),
        num_heads=hq,
        num_kv_heads=hkv,
        eps=o.eps,
        rope_cos=o.cos,
        rope_sin=o.sin,
        head_norm=o.head_norm,
        head_eps=o.head_eps,
        head_rows=QuantWeight(o.head_data, QuantType(o.qtype), o.cols),
        markov_in=o.markov_in,
        markov_out=unpack_panels(o.markov_out, int(o.head_data.shape[0])),
        vocab_ids=o.vocab if o.vocab.numel() else None,
        conf_w=o.conf_w,
        conf_b=o.conf_b,
    )
    tokens, conf, _ = dspark_greedy_draft_reference(
        block, anchor_embed, anchor_ids, context, valid, num_tokens
    )
    return tokens, conf


@functools.cache
def _greedy_function() -> NativeFunction:
    """The op's C function (built on first use, once per process)."""
    return NativeFunction(DSPARK_DRAFT, "deepinfer_dspark_greedy_draft")


@torch.library.custom_op("deepinfer::dspark_greedy_draft", mutates_args=())
def dspark_greedy_draft_op(
    anchor_embed: torch.Tensor,
    anchor_ids: torch.Tensor,
    context: torch.Tensor,
    valid: torch.Tensor | None,
    num_tokens: int,
    weights: list[torch.Tensor],
    scalars: list[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled greedy block as an op: ``(tokens [B, m], confidence [B, m])``.

    ``weights, scalars = kernel.op_args()`` of a :class:`DSparkDraftKernel` (packed once).
    Eager callers call :meth:`DSparkDraftKernel.greedy` directly (no dispatcher round trip);
    the op exists for ``torch.compile`` (its fake gives the shapes) and other engines. Without
    a C compiler it runs :func:`dspark_greedy_draft_reference` on the unpacked weights."""
    o = PackedOperands.unpack(weights, scalars)
    layers, hq, hkv, inter, qtype = o.layers, o.num_heads, o.num_kv_heads, o.intermediate, o.qtype
    eps, head_eps, conf_b, per_layer = o.eps, o.head_eps, o.conf_b, o.per_layer
    mask, cos, sin, head_norm, head_data = o.mask, o.cos, o.sin, o.head_norm, o.head_data
    markov_in, markov_out, vocab, conf_w = o.markov_in, o.markov_out, o.vocab, o.conf_w
    hidden = int(mask.shape[1])
    fn = _greedy_function()
    if fn.available():
        batch, width, gamma, d = (
            int(anchor_ids.shape[0]),
            int(context.shape[1]),
            int(mask.shape[0]) + 1,
            hidden // hq,
        )
        ctx = context.float().contiguous()
        ok = None if valid is None else valid.contiguous().view(torch.uint8)
        embed = anchor_embed.float().contiguous()
        ids = anchor_ids.to(torch.int64).contiguous()
        table = torch.tensor([t.data_ptr() for t in per_layer], dtype=torch.int64)
        tokens = torch.empty(batch, num_tokens, dtype=torch.int64)
        conf = torch.empty(batch, num_tokens)
        offset = (int(cos.shape[0]) - gamma - width) * (d // 2)
        p = address
        rc = fn(
            p(embed), p(mask), p(ctx), ctx.stride(0), p(ok), cos.data_ptr() + 4 * offset,
            sin.data_ptr() + 4 * offset, p(table), p(head_norm), head_eps, p(head_data), qtype,
            int(head_data.shape[1]), p(markov_in), p(markov_out),
            p(vocab) if vocab.numel() else None, p(conf_w), conf_b, p(ids), p(tokens), p(conf),
            None, eps, batch, gamma, width, num_tokens, layers, hidden, hq, hkv, d, inter,
            int(head_data.shape[0]), int(markov_in.shape[1]),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError(f"deepinfer_dspark_greedy_draft failed ({rc})")
        return tokens, conf
    return op_reference(anchor_embed, anchor_ids, context, valid, num_tokens, weights, scalars)


@dspark_greedy_draft_op.register_fake
def _(
    anchor_embed: torch.Tensor,
    anchor_ids: torch.Tensor,
    context: torch.Tensor,
    valid: torch.Tensor | None,
    num_tokens: int,
    weights: list[torch.Tensor],
    scalars: list[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    batch = anchor_ids.shape[0]
    return (
        anchor_ids.new_empty(batch, num_tokens, dtype=torch.int64),
        anchor_embed.new_empty(batch, num_tokens, dtype=torch.float32),
    )
