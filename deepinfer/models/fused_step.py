"""A compiled decoder-layer step bound once per batch size and reused by the steps after it.

``LlamaModel`` runs a few-row step on a CPU as three foreign calls per layer (QKV + RoPE + K/V
write, attention, o-proj + MLP + norms: ``FusedLayerKernel``). Binding those calls (checking the
operands, packing ~20 ctypes arguments for each of 90 calls) and planning the attention were
~3 ms of a ~30 ms SmolLM2-135M decode step on a 2-core CPU, redone at every step although
consecutive decode steps differ only in values: the token's embedding, its RoPE angles, its
cache slot, the pages it reads and its key length.

:class:`BoundStep` owns the step's buffers (residual, normed input, QKV, attention output,
scratch, RoPE tables, slots) and binds every layer's calls over them once; each step copies its
values into the buffers, and a decode step (one query per sequence) re-points the bound
attention at its pages (``BoundTiles.retarget``), so no argument is rebuilt. The model keeps
one per batch size (:class:`BoundSteps`) while the weights, the norms and the KV pool are the
ones it was bound to.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer.models.layers import RMSNorm
from deepinfer_kernels.cpu import (
    BoundTiles,
    DecodeTiles,
    FusedLayerKernel,
    LayerShape,
    PagedAttentionTiles,
    plan_decode_tiles,
    plan_verify_tile,
)
from deepinfer_kernels.cpu.decode_tiles import SHORT_TILE

# Batch sizes kept bound at once (continuous batching moves between a few).
MAX_BOUND_STEPS = 8


def _pool_key(num_layers: int, k0: torch.Tensor, v0: torch.Tensor) -> tuple[int, ...]:
    # The bound calls hold views of the pool's storage, so no other pool can live at these
    # addresses while this one is bound.
    return (num_layers, k0.data_ptr(), v0.data_ptr(), *k0.shape)


class BoundStep:
    """Every layer's compiled calls for ``rows`` rows over buffers this object owns (see the
    module doc). ``norms[i]`` are the modules whose ``weight`` follows layer ``i``'s attention
    and its MLP (its post-attention norm, the next input norm or the final norm)."""

    def __init__(
        self,
        kernel: FusedLayerKernel[Any],
        panels: tuple[Any, ...],
        shape: LayerShape,
        rows: int,
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
        norms: Sequence[tuple[RMSNorm, RMSNorm]],
        eps: float,
        tiles: PagedAttentionTiles | None,
        scale: float,
    ) -> None:
        self.kernel, self.panels, self.rows, self.shape = kernel, panels, rows, shape
        self.pool = _pool_key(len(k_caches), k_caches[0], v_caches[0])
        self.capacity = int(k_caches[0].shape[0] * k_caches[0].shape[1])
        d = shape.head_dim
        self.residual = torch.zeros(rows, shape.hidden)
        self.normed = torch.zeros(rows, shape.hidden)
        self.qkv = torch.zeros(rows, shape.qkv_width)
        self.attn_out = torch.zeros(rows, shape.num_heads * d)
        self.cos, self.sin = torch.zeros(rows, d), torch.zeros(rows, d)
        scratch = torch.zeros(shape.scratch_size(rows))
        self.slots = kernel.slot_mapping(torch.zeros(rows, dtype=torch.int64), self.capacity)
        weights = [(post.weight, after.weight) for post, after in norms]
        # What the bound norm arguments point at: each module's parameter dict, the tensor,
        # its storage (replacing the parameter or its ``.data`` re-binds; in-place is fine).
        self._norms = [
            (m._parameters, w, w.data_ptr())
            for pair, ws in zip(norms, weights)
            for m, w in zip(pair, ws)
        ]
        self.layers = kernel.bind(shape, panels, self.normed, self.qkv, self.cos, self.sin,
                                  self.slots, k_caches, v_caches, self.attn_out, self.residual,
                                  weights, eps, scratch)  # fmt: skip
        self.q = self.qkv.view(rows, -1, d)[:, : shape.num_heads]
        self.attn_view = self.attn_out.view(rows, -1, d)
        self.k_caches, self.v_caches = list(k_caches), list(v_caches)
        # The attention bound for decode steps (one query per row), re-pointed every step.
        self.decode: BoundTiles | None = None
        if tiles is not None and tiles.applies(self.q, k_caches[0], v_caches[0], 1):
            first = plan_decode_tiles(
                [[0]] * rows,
                [1] * rows,
                block_size=int(k_caches[0].shape[1]),
                num_blocks=int(k_caches[0].shape[0]),
                num_q_heads=shape.num_heads,
            )
            if first is not None and tiles.available():
                self.decode = BoundTiles(
                    tiles, self.q, k_caches, v_caches, self.attn_view,
                    page_ids=first.page_ids, keep=first.keep, num_tiles=rows, max_q=1,
                    num_pages=first.num_pages, key_len=first.key_len, scale=scale, soft_cap=0.0,
                )  # fmt: skip
        # The attention bound for a verification step: the rows are one sequence's last
        # tokens (a DSpark verify of rows - 1 drafts), one causal tile, re-pointed every step.
        self.verify: BoundTiles | None = None
        if (
            self.decode is not None
            and 1 < rows <= SHORT_TILE
            and tiles is not None
            and tiles.applies(self.q, k_caches[0], v_caches[0], rows)
        ):
            block_size = int(k_caches[0].shape[1])
            # A placeholder table long enough for `rows` keys (retarget swaps in the real one):
            # a step of more rows than a block holds spans several pages.
            one = plan_verify_tile(
                [0] * -(-rows // block_size), rows, rows, block_size=block_size,
                num_blocks=int(k_caches[0].shape[0]), num_q_heads=shape.num_heads,
            )  # fmt: skip
            if one is not None:
                self.verify = BoundTiles(
                    tiles, self.q, k_caches, v_caches, self.attn_view,
                    page_ids=one.page_ids, keep=one.keep, num_tiles=1, max_q=rows,
                    num_pages=one.num_pages, key_len=one.key_len, scale=scale, soft_cap=0.0,
                )  # fmt: skip

    def norms_current(self) -> bool:
        """Whether every norm weight is still the tensor and storage the calls were bound to."""
        return all(
            params.get("weight") is w and w.data_ptr() == ptr for params, w, ptr in self._norms
        )

    def load(
        self, residual: torch.Tensor, normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:  # fmt: skip
        """Copy a step's values into the bound buffers (``slots``: checked here)."""
        values = slots.tolist()
        if min(values) < 0 or max(values) >= self.capacity:
            raise ValueError(f"attn.slot_mapping: expected slots in [0, {self.capacity})")
        self.slots.slots.copy_(slots)
        self.residual.copy_(residual)
        self.normed.copy_(normed)
        self.cos.copy_(cos.reshape(self.rows, -1))
        self.sin.copy_(sin.reshape(self.rows, -1))

    def bound_attention(self, attn: AttentionMetadata) -> BoundTiles | None:
        """The bound attention re-pointed at this step's pages: the decode runner for a decode
        step, the verification runner for a step of one sequence's last ``rows`` tokens; None
        for any other step (the caller plans it)."""
        # The query offsets are read once and name the step's kind, so a verification step
        # goes straight to its tile (it used to try the decode tiles first: ~100 us against
        # ~56 for a decode step, in situ).
        offsets = attn.cu_seqlens_q.tolist()
        if self.decode is not None and offsets == list(range(self.rows + 1)):
            tiles = self._decode_tiles(attn)
            if tiles is None:
                return None
            self.decode.retarget(tiles)
            return self.decode
        if self.verify is None or offsets != [0, self.rows]:
            return None
        verify = plan_verify_tile(
            attn.block_table.tolist()[0], attn.seq_lens.tolist()[0], self.rows,
            block_size=int(self.k_caches[0].shape[1]),
            num_blocks=int(self.k_caches[0].shape[0]), num_q_heads=self.shape.num_heads,
        )  # fmt: skip
        if verify is None:
            return None
        self.verify.retarget(verify)
        return self.verify

    def decode_tiles(self, attn: AttentionMetadata) -> DecodeTiles | None:
        """This step's attention as decode tiles, or None when it is not a decode step the
        bound attention can take (a row with several queries, or a batch the general planner
        would split)."""
        if self.decode is None or attn.cu_seqlens_q.tolist() != list(range(self.rows + 1)):
            return None
        return self._decode_tiles(attn)

    def _decode_tiles(self, attn: AttentionMetadata) -> DecodeTiles | None:
        # A step of one query per row: its pages and key lengths as decode tiles.
        return plan_decode_tiles(
            attn.block_table.tolist(),
            attn.seq_lens.tolist(),
            block_size=int(self.k_caches[0].shape[1]),
            num_blocks=int(self.k_caches[0].shape[0]),
            num_q_heads=self.shape.num_heads,
        )


class BoundSteps:
    """A model's :class:`BoundStep` per batch size and thread (at most
    :data:`MAX_BOUND_STEPS`, oldest dropped), each reused while the kernel, its weights tuple,
    the norms and the pool are the ones it was bound to."""

    def __init__(self) -> None:
        self._steps: dict[tuple[int, int], BoundStep] = {}

    def get(
        self,
        kernel: FusedLayerKernel[Any],
        panels: tuple[Any, ...],
        rows: int,
        num_layers: int,
        first_caches: tuple[torch.Tensor, torch.Tensor],
    ) -> BoundStep | None:
        """The step bound for ``rows`` rows, if it is bound to ``kernel``, ``panels``, the
        current norms and a pool of ``num_layers`` layers whose layer 0 is ``first_caches``
        (a pool's layers are views of one storage the step holds)."""
        step = self._steps.get((rows, threading.get_ident()))
        if (
            step is not None
            and step.kernel is kernel
            and step.panels is panels
            and step.pool == _pool_key(num_layers, *first_caches)
            and step.norms_current()
        ):
            return step
        return None

    def put(self, step: BoundStep) -> BoundStep:
        """Keep ``step`` for its batch size and the calling thread (two threads running one
        model at once must not share step buffers)."""
        key = (step.rows, threading.get_ident())
        self._steps.pop(key, None)
        if len(self._steps) >= MAX_BOUND_STEPS:
            del self._steps[next(iter(self._steps))]
        self._steps[key] = step
        return step

    def clear(self) -> None:
        self._steps.clear()
