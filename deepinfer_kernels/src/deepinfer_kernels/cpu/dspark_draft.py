"""A DSpark drafter's greedy block and context entries as one compiled call each.

The DSpark drafter (``deepinfer_spec``) proposes a block by a one-layer parallel backbone over
``[anchor ; masks]`` that attends to its context's keys and values, the target's head rows of
its draft vocabulary, a Markov bias ``W1[prev] W2`` and a confidence ``sigmoid(w . [h ; e])``.
Run as torch modules that is ~80 ops and a dozen foreign product calls per proposal, and on a
CPU their dispatch cost about as much as their arithmetic. :class:`DSparkDraftKernel` runs the
whole greedy proposal as ``csrc/dspark_draft.c``'s one call (and the projection of new
positions into context entries as another), on the drafter's bf16-exact weights in bf16
panels and the head rows in the target's own GGUF format.

This module knows nothing of ``deepinfer_spec``: it takes the weights as plain tensors
(:class:`DraftBlockWeights`, :class:`DraftContextWeights`). :func:`dspark_greedy_draft_reference`
and :func:`dspark_context_kv_reference` are the same computations in plain torch, the
definition the compiled calls are tested against (equal up to fp32 rounding).

Example::

    kernel = DSparkDraftKernel(block_weights, context_weights)
    if kernel.available():
        tokens, confidence = kernel.greedy(anchor_embed, anchor_ids, context, valid, 1)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from deepinfer_kernels.cpu.bf16_weight_linear import bf16_panels, unpack_panels
from deepinfer_kernels.cpu.native import NativeFunction
from deepinfer_kernels.cpu.sources import DSPARK_DRAFT
from deepinfer_kernels.quant.formats import QuantType, QuantWeight
from deepinfer_kernels.quant.ops import dequantize


@dataclass(frozen=True)
class DraftLayerWeights:
    """One backbone layer: norms ``[H]``; ``qkv [(hq + 2 hkv) d, H]`` (queries, keys, values
    stacked), ``o [H, hq d]``, ``gate_up [2 I, H]`` (gate then up), ``down [H, I]``."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True)
class DraftBlockWeights:
    """What a greedy proposal reads (fp32 CPU tensors unless said otherwise).

    ``mask_embed [G-1, H]``; ``layers``; ``rope_cos``/``rope_sin [W + G, d/2]``, the rotation
    of relative positions ``-W .. G-1``; ``head_norm [H]``/``head_eps``: the target's final
    norm; ``head_rows``: the target's head rows of the draft vocabulary (any GGUF format);
    ``markov_in [vocab, r]`` (W1), ``markov_out [V, r]`` (W2); ``vocab_ids [V]`` int64 (draft
    index -> token id) or ``None`` (the identity); ``conf_w [H + r]``, ``conf_b``.
    """

    mask_embed: torch.Tensor
    layers: tuple[DraftLayerWeights, ...]
    num_heads: int
    num_kv_heads: int
    eps: float
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    head_norm: torch.Tensor
    head_eps: float
    head_rows: QuantWeight
    markov_in: torch.Tensor
    markov_out: torch.Tensor
    vocab_ids: torch.Tensor | None
    conf_w: torch.Tensor
    conf_b: float

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("layers: expected at least one backbone layer")
        hidden = int(self.mask_embed.shape[-1])
        if self.num_heads % self.num_kv_heads or hidden % self.num_heads:
            raise ValueError(
                f"num_heads: {self.num_heads} heads of {hidden} must group into "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_rows.cols != hidden:
            raise ValueError(f"head_rows: expected {hidden} columns, got {self.head_rows.cols}")
        if self.markov_out.shape[0] != self.head_rows.rows:
            raise ValueError(
                f"markov_out: expected {self.head_rows.rows} rows (one per head row), "
                f"got {tuple(self.markov_out.shape)}"
            )
        if self.vocab_ids is not None and tuple(self.vocab_ids.shape) != (self.head_rows.rows,):
            raise ValueError(f"vocab_ids: expected [{self.head_rows.rows}]")
        if len({tuple(layer.down.shape) for layer in self.layers}) != 1:
            raise ValueError("layers: expected every backbone layer to have the same shapes")

    @property
    def hidden_size(self) -> int:
        return int(self.mask_embed.shape[-1])

    @property
    def gamma(self) -> int:
        return int(self.mask_embed.shape[0]) + 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def intermediate_size(self) -> int:
        return int(self.layers[0].down.shape[1])

    @property
    def window(self) -> int:
        return int(self.rope_cos.shape[0]) - self.gamma


@dataclass(frozen=True)
class DraftContextWeights:
    """The projection of raw target features ``[T, F]`` into context entries: standardise
    (``shift``, ``scale [F]``), ``proj [H, F]``, RMSNorm (``norm [H]``, ``eps``), then every
    layer's keys and values ``kv [L * 2 * kv_dim, H]`` (layer 0's keys, its values, ...)."""

    shift: torch.Tensor
    scale: torch.Tensor
    proj: torch.Tensor
    norm: torch.Tensor
    eps: float
    kv: torch.Tensor


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def dspark_greedy_draft_reference(
    weights: DraftBlockWeights,
    anchor_embed: torch.Tensor,
    anchor_ids: torch.Tensor,
    context: torch.Tensor,
    valid: torch.Tensor | None,
    num_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens [B, m] int64, confidence [B, m], hidden [B, G, H])`` of the greedy block, in
    plain torch (the definition; see ``csrc/dspark_draft.c``)."""
    w = weights
    batch, width = int(context.shape[0]), int(context.shape[1])
    gamma, d = w.gamma, w.head_dim
    hq, hkv = w.num_heads, w.num_kv_heads
    kv = hkv * d
    x = torch.cat((anchor_embed[:, None].float(), w.mask_embed[None].expand(batch, -1, -1)), 1)
    cos, sin = w.rope_cos[-(width + gamma) :], w.rope_sin[-(width + gamma) :]
    keep = torch.ones(batch, width + gamma, dtype=torch.bool)
    if valid is not None:
        keep[:, :width] = valid
    for i, layer in enumerate(w.layers):
        h = _rms(x, layer.input_norm, w.eps)
        qkv = h @ layer.qkv.T
        q, k, v = torch.split(qkv, [hq * d, kv, kv], dim=-1)
        entries = context[..., 2 * i * kv : 2 * (i + 1) * kv].float()
        keys = torch.cat((entries[..., :kv], k), 1).view(batch, -1, hkv, d).transpose(1, 2)
        values = torch.cat((entries[..., kv:], v), 1).view(batch, -1, hkv, d).transpose(1, 2)
        q = q.view(batch, gamma, hq, d).transpose(1, 2)
        q, keys = _rotate(q, cos[width:], sin[width:]), _rotate(keys, cos, sin)
        rep = hq // hkv
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        att = (scores.softmax(-1) @ values).transpose(1, 2).reshape(batch, gamma, hq * d)
        x = x + att @ layer.o.T
        n = _rms(x, layer.post_norm, w.eps)
        gate, up = (n @ layer.gate_up.T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ layer.down.T
    head = dequantize(w.head_rows)
    base = _rms(x[:, :num_tokens], w.head_norm, w.head_eps) @ head.T
    tokens = torch.empty(batch, num_tokens, dtype=torch.int64)
    conf = torch.empty(batch, num_tokens)
    prev = anchor_ids.to(torch.int64)
    for j in range(num_tokens):
        e = w.markov_in[prev]
        index = torch.argmax(base[:, j] + e @ w.markov_out.T, dim=-1)
        prev = index if w.vocab_ids is None else w.vocab_ids[index]
        tokens[:, j] = prev
        z = torch.cat((x[:, j], e), -1) @ w.conf_w + w.conf_b
        conf[:, j] = torch.sigmoid(z)
    return tokens, conf, x


def dspark_context_kv_reference(
    weights: DraftContextWeights, features: torch.Tensor
) -> torch.Tensor:
    """Context entries ``[T, L * 2 * kv_dim]`` of raw features ``[T, F]``, in plain torch."""
    w = weights
    standard = (features.float() - w.shift) * w.scale
    return _rms(standard @ w.proj.T, w.norm, w.eps) @ w.kv.T


def _panels(name: str, weight: torch.Tensor) -> torch.Tensor:
    panels = bf16_panels(weight.detach().float().contiguous())
    if panels is None:
        raise ValueError(f"{name}: expected weights that are exactly bf16 values (fp32, CPU)")
    return panels


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().contiguous()


class DSparkDraftKernel:
    """The compiled greedy proposal and context projection over packed copies of the weights.

    Raises ``ValueError`` when a drafter weight is not exactly bf16 values (the panels would
    round it). ``enabled=None`` reads ``DEEPINFER_CPU_KERNELS`` (``0`` turns it off); without a
    C compiler :meth:`available` is False and callers keep the torch modules.
    """

    def __init__(
        self,
        block: DraftBlockWeights,
        context: DraftContextWeights,
        *,
        cache_dir: Path | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.block, self.context = block, context
        self._draft = NativeFunction(
            DSPARK_DRAFT, "deepinfer_dspark_greedy_draft", cache_dir=cache_dir, enabled=enabled
        )
        self._context_kv = NativeFunction(
            DSPARK_DRAFT, "deepinfer_dspark_context_kv", cache_dir=cache_dir, enabled=enabled
        )
        # Packed once: what the C side reads (kept alive here; the layer table holds addresses).
        self._keep: list[torch.Tensor] = []
        addresses: list[int] = []
        for i, layer in enumerate(block.layers):
            for name, tensor, pack in (
                ("input_norm", layer.input_norm, False),
                ("qkv", layer.qkv, True),
                ("o", layer.o, True),
                ("post_norm", layer.post_norm, False),
                ("gate_up", layer.gate_up, True),
                ("down", layer.down, True),
            ):
                t = _panels(f"layers[{i}].{name}", tensor) if pack else _f32(tensor)
                self._keep.append(t)
                addresses.append(t.data_ptr())
        self._layers = torch.tensor(addresses, dtype=torch.int64)
        self._mask = _f32(block.mask_embed)
        self._cos, self._sin = _f32(block.rope_cos), _f32(block.rope_sin)
        self._head_norm = _f32(block.head_norm)
        self._markov_in = _f32(block.markov_in)
        self._markov_out = _panels("markov_out", block.markov_out)
        self._vocab = (
            None if block.vocab_ids is None else block.vocab_ids.to(torch.int64).contiguous()
        )
        self._conf_w = _f32(block.conf_w)
        self._shift, self._scale = _f32(context.shift), _f32(context.scale)
        self._proj = _panels("proj", context.proj)
        self._norm = _f32(context.norm)
        self._kv = _panels("kv", context.kv)

    @property
    def error(self) -> str | None:
        """Why the kernel could not be built, once that was tried."""
        return self._draft.error

    def available(self) -> bool:
        """Whether the compiled calls can run here (builds them on the first call)."""
        return self._draft.available() and self._context_kv.available()

    def greedy(
        self,
        anchor_embed: torch.Tensor,
        anchor_ids: torch.Tensor,
        context: torch.Tensor,
        valid: torch.Tensor | None,
        num_tokens: int,
        *,
        hidden_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens [B, m] int64, confidence [B, m])``: the greedy drafts of positions
        ``1 .. m`` after each anchor.

        ``anchor_embed [B, H]``; ``anchor_ids [B]``; ``context [B, W, C]`` the rows' context
        entries (oldest first, ``W <=`` the window; rows may be strided); ``valid [B, W]`` bool
        or ``None`` (all valid); ``hidden_out``: optional ``[B, m, H]`` fp32 receiving the
        backbone's hidden states of the drawn positions (the last layer computes no others).
        """
        w = self.block
        batch, gamma, hidden = int(anchor_ids.shape[0]), w.gamma, w.hidden_size
        if anchor_ids.dim() != 1:
            raise ValueError(f"anchor_ids: expected [B], got {tuple(anchor_ids.shape)}")
        if tuple(anchor_embed.shape) != (batch, hidden):
            raise ValueError(f"anchor_embed: expected [{batch}, {hidden}]")
        entry = 2 * len(w.layers) * w.num_kv_heads * w.head_dim
        if context.dim() != 3 or context.shape[0] != batch or context.shape[2] != entry:
            raise ValueError(f"context: expected [{batch}, W, {entry}], got {tuple(context.shape)}")
        width = int(context.shape[1])
        if width > w.window:
            raise ValueError(f"context: {width} positions exceed the window {w.window}")
        if not isinstance(num_tokens, int) or not 1 <= num_tokens <= gamma:
            raise ValueError(f"num_tokens: expected an int in [1, {gamma}], got {num_tokens!r}")
        vocab = int(self._markov_in.shape[0])
        ids_list = anchor_ids.tolist()  # one read, where min() and max() were two
        if ids_list and (min(ids_list) < 0 or max(ids_list) >= vocab):
            raise ValueError(f"anchor_ids: expected token ids in [0, {vocab})")
        if context.dtype != torch.float32 or context.stride(2) != 1 or context.stride(1) != entry:
            context = context.float().contiguous()
        ok = None
        if valid is not None:
            if tuple(valid.shape) != (batch, width) or valid.dtype != torch.bool:
                raise ValueError(f"valid: expected bool [{batch}, {width}]")
            ok = valid.contiguous().view(torch.uint8)
        if hidden_out is not None and (
            tuple(hidden_out.shape) != (batch, num_tokens, hidden)
            or hidden_out.dtype != torch.float32
            or not hidden_out.is_contiguous()
        ):
            raise ValueError(
                f"hidden_out: expected contiguous fp32 [{batch}, {num_tokens}, {hidden}]"
            )
        embed = _operand(anchor_embed, torch.float32)
        ids = _operand(anchor_ids, torch.int64)
        tokens = torch.empty(batch, num_tokens, dtype=torch.int64)
        conf = torch.empty(batch, num_tokens)
        half = w.head_dim // 2
        offset = (w.window - width) * half  # the tables' rows of positions -width .. G-1
        head = w.head_rows
        p = _address
        rc = self._draft(
            p(embed), p(self._mask), p(context), context.stride(0), p(ok),
            self._cos.data_ptr() + 4 * offset, self._sin.data_ptr() + 4 * offset,
            p(self._layers), p(self._head_norm), w.head_eps, p(head.data), int(head.qtype),
            int(head.data.shape[1]), p(self._markov_in), p(self._markov_out), p(self._vocab),
            p(self._conf_w), w.conf_b, p(ids), p(tokens), p(conf), p(hidden_out), w.eps,
            batch, gamma, width, num_tokens, len(w.layers), hidden, w.num_heads,
            w.num_kv_heads, w.head_dim, w.intermediate_size, head.rows,
            int(self._markov_in.shape[1]),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError(f"deepinfer_dspark_greedy_draft failed ({rc})")
        return tokens, conf

    def op_args(self) -> tuple[list[torch.Tensor], list[float]]:
        """``(tensors, scalars)`` that ``torch.ops.deepinfer.dspark_greedy_draft`` takes after
        the per-call inputs: this kernel's packed weights, and its shape and norms."""
        w = self.block
        vocab = torch.empty(0, dtype=torch.int64) if self._vocab is None else self._vocab
        tensors = [
            *self._keep,
            self._mask, self._cos, self._sin, self._head_norm, w.head_rows.data,
            self._markov_in, self._markov_out, vocab, self._conf_w,
        ]  # fmt: skip
        scalars = [
            float(v)
            for v in (
                len(w.layers), w.num_heads, w.num_kv_heads, w.intermediate_size,
                int(w.head_rows.qtype), w.head_rows.cols, w.eps, w.head_eps, w.conf_b,
            )
        ]  # fmt: skip
        return tensors, scalars

    def context_kv(self, features: torch.Tensor) -> torch.Tensor:
        """Context entries ``[T, L * 2 * kv_dim]`` of raw target features ``[T, F]``."""
        c = self.context
        width = int(c.shift.shape[0])
        if features.dim() != 2 or features.shape[1] != width:
            raise ValueError(f"features: expected [T, {width}], got {tuple(features.shape)}")
        x = _operand(features, torch.float32)
        hidden, entry = int(c.proj.shape[0]), int(c.kv.shape[0])
        out = torch.empty(x.shape[0], entry)
        if x.shape[0]:
            rc = self._context_kv(
                x.data_ptr(), self._shift.data_ptr(), self._scale.data_ptr(),
                self._proj.data_ptr(), self._norm.data_ptr(), c.eps, self._kv.data_ptr(),
                out.data_ptr(), x.shape[0], width, hidden, entry,
            )  # fmt: skip
            if rc != 0:
                raise MemoryError(f"deepinfer_dspark_context_kv failed ({rc})")
        return out


def _operand(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a contiguous ``dtype`` tensor for the C side, converted only when it is not one
    already: a step's few-row operands usually are, and each conversion call is a tensor op's
    dispatch (~10 us on a CPU right after the kernels). The C side only reads it, so autograd
    history does not matter."""
    if t.dtype == dtype and t.is_contiguous():
        return t
    return t.detach().to(dtype).contiguous()


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


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
    layers, hq, hkv, inter, qtype, cols = (int(v) for v in scalars[:6])
    eps, head_eps, conf_b = scalars[6:9]
    per_layer = weights[: 6 * layers]
    mask, cos, sin, head_norm, head_data, markov_in, markov_out, vocab, conf_w = weights[
        6 * layers :
    ]
    hidden = int(mask.shape[1])
    block = DraftBlockWeights(
        mask_embed=mask,
        layers=tuple(
            DraftLayerWeights(
                per_layer[6 * i],
                unpack_panels(per_layer[6 * i + 1], (hq + 2 * hkv) * (hidden // hq)),
                unpack_panels(per_layer[6 * i + 2], hidden),
                per_layer[6 * i + 3],
                unpack_panels(per_layer[6 * i + 4], 2 * inter),
                unpack_panels(per_layer[6 * i + 5], hidden),
            )
            for i in range(layers)
        ),
        num_heads=hq,
        num_kv_heads=hkv,
        eps=eps,
        rope_cos=cos,
        rope_sin=sin,
        head_norm=head_norm,
        head_eps=head_eps,
        head_rows=QuantWeight(head_data, QuantType(qtype), cols),
        markov_in=markov_in,
        markov_out=unpack_panels(markov_out, int(head_data.shape[0])),
        vocab_ids=vocab if vocab.numel() else None,
        conf_w=conf_w,
        conf_b=conf_b,
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
    layers, hq, hkv, inter, qtype = (int(v) for v in scalars[:5])
    eps, head_eps, conf_b = scalars[6:9]
    per_layer = weights[: 6 * layers]
    mask, cos, sin, head_norm, head_data, markov_in, markov_out, vocab, conf_w = weights[
        6 * layers :
    ]
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
        p = _address
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
