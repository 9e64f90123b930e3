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

from pathlib import Path

import torch

from deepinfer_kernels.cpu.bf16_weight_linear import bf16_panels
from deepinfer_kernels.cpu.dspark_draft_op import address as _address
from deepinfer_kernels.cpu.dspark_draft_op import dspark_greedy_draft_op, op_reference
from deepinfer_kernels.cpu.dspark_reference import (
    dspark_context_kv_reference,
    dspark_greedy_draft_reference,
)
from deepinfer_kernels.cpu.dspark_weights import (
    DraftBlockWeights,
    DraftContextWeights,
    DraftLayerWeights,
)
from deepinfer_kernels.cpu.native import NativeFunction
from deepinfer_kernels.cpu.sources import DSPARK_DRAFT

# The weights, the torch references and the registered op live in their own modules; their
# import paths here are kept (deepinfer_spec.native_draft, the tests, register_torch_ops).
__all__ = [
    "DSparkDraftKernel",
    "DraftBlockWeights",
    "DraftContextWeights",
    "DraftLayerWeights",
    "dspark_context_kv_reference",
    "dspark_greedy_draft_op",
    "dspark_greedy_draft_reference",
    "op_reference",
]


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
