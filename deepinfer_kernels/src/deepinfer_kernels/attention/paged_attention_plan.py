"""`PagedAttentionPlan`: a batch's validated metadata and precomputed tiles, run once per
layer (see ``plan.py`` for the plan / run split and :func:`plan_paged_attention`, which builds
it). ``run`` checks each layer's operands against the plan and takes the torch path, the
unified Triton kernel or split-K decode; ``bind_cpu_layers`` binds every layer of a step to
the compiled CPU kernel at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.attention.torch_path import TileBatch, run_tile_batches
from deepinfer_kernels.attention.validate import ATTN_DTYPES
from deepinfer_kernels.cpu.attention import BoundTiles, PagedAttentionTiles


class PagedAttentionPlan:
    """Validated batch metadata plus the precomputed, layer-independent work of one batch.

    Build it with :func:`plan_paged_attention`; call :meth:`run` once per layer.
    """

    def __init__(
        self,
        *,
        decode_splits: int = 1,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        block_size: int,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        causal: bool,
        window: int,
        soft_cap: float,
        use_triton: bool,
        total_q: int | None,
        max_block_id: int,
        batches: list[TileBatch],
        cpu_kernel: PagedAttentionTiles | None = None,
    ) -> None:
        self.block_table = block_table
        self.seq_lens = seq_lens
        self.cu_seqlens_q = cu_seqlens_q
        self.block_size = block_size
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.causal = causal
        self.window = window
        self.soft_cap = soft_cap
        self.use_triton = use_triton
        self.total_q = total_q  # None on the Triton path (reading it would sync)
        self.max_block_id = max_block_id  # -1 when unknown or no page is read
        self._batches = batches
        self.cpu_kernel = cpu_kernel
        # > 1: the Triton path runs split-K decode with this many key chunks per sequence.
        self.decode_splits = decode_splits

    @property
    def device(self) -> torch.device:
        return self.block_table.device

    @property
    def num_tile_batches(self) -> int:
        """How many batched attention calls one :meth:`run` makes on the torch path."""
        return len(self._batches)

    @property
    def masked(self) -> bool:
        """False when no tile batch needs a mask (the fast path: decode batches of equal
        lengths, a lone decode)."""
        return any(tb.keep is not None for tb in self._batches)

    def _check(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t)!r}")
            if t.device != self.device:
                raise ValueError(
                    f"{name}: expected device {self.device} (the plan's), got {t.device}"
                )
        hq, d = self.num_q_heads, self.head_dim
        if q.dim() != 3 or q.shape[1] != hq or q.shape[2] != d:
            raise ValueError(f"q: expected [total_q, {hq}, {d}], got shape {tuple(q.shape)}")
        if self.total_q is not None and q.shape[0] != self.total_q:
            raise ValueError(
                f"q: expected {self.total_q} rows (cu_seqlens_q[-1]), got {q.shape[0]}"
            )
        if self.decode_splits > 1 and q.shape[0] != self.block_table.shape[0]:
            raise ValueError(
                f"q: split-K decode expects one row per sequence "
                f"({self.block_table.shape[0]}), got {q.shape[0]}"
            )
        if q.dtype not in ATTN_DTYPES:
            raise ValueError(f"q: expected dtype float32, float16 or bfloat16, got {q.dtype}")
        want = (self.block_size, self.num_kv_heads, d)
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dim() != 4 or tuple(t.shape[1:]) != want:
                raise ValueError(
                    f"{name}: expected [num_blocks, {', '.join(map(str, want))}], "
                    f"got shape {tuple(t.shape)}"
                )
            if t.dtype != q.dtype:
                raise ValueError(f"{name}: expected dtype {q.dtype} (same as q), got {t.dtype}")
            if t.stride(-1) != 1:
                raise ValueError(f"{name}: expected a unit stride on head_dim")
        if v_cache.shape[0] != k_cache.shape[0]:
            raise ValueError(
                f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, "
                f"got {tuple(v_cache.shape)}"
            )
        if self.max_block_id >= k_cache.shape[0]:
            raise ValueError(
                f"block_table: block id {self.max_block_id} is outside the pool of "
                f"{k_cache.shape[0]} blocks"
            )

    def bind_cpu_layers(
        self,
        q: torch.Tensor,
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
        out: torch.Tensor,
    ) -> BoundTiles | None:
        """Every layer's :meth:`run` on the plan's CPU kernel, checked once: ``bound(i)`` writes
        ``run(q, k_caches[i], v_caches[i])`` into ``out`` (contiguous fp32 shaped like ``q``),
        reading ``q`` as it is at that moment.

        For a model whose layers attend with the same batch and buffers (a decode or
        verification step): the per-layer Python work of :meth:`run` (checks, dispatch,
        allocation) cost about as much as the attention itself on a 2-core CPU. ``None`` when
        the plan cannot run that way (Triton path, no or unavailable CPU kernel, operands it
        does not apply to, or tile batches that need a gather or scatter of rows); then call
        :meth:`run`.
        """
        if self.use_triton or self.cpu_kernel is None or len(self._batches) != 1:
            return None
        if len(k_caches) != len(v_caches) or not k_caches:
            raise ValueError(
                f"v_caches: expected one per k_cache, got {len(v_caches)} and {len(k_caches)}"
            )
        tb = self._batches[0]
        if tb.row_start != 0 or tb.num_rows != q.shape[0]:
            return None
        first = (k_caches[0], v_caches[0])
        self._check(q, *first)
        layout = [(t.shape, t.stride(), t.dtype, t.device) for t in first]
        for k, v in zip(k_caches, v_caches):
            if [(t.shape, t.stride(), t.dtype, t.device) for t in (k, v)] != layout:
                self._check(q, k, v)  # raises naming what differs
                raise ValueError("k_caches/v_caches: every layer's caches must share one layout")
        kernel = self.cpu_kernel
        if not (kernel.applies(q, *first, tb.max_q) and kernel.available()):
            return None
        return BoundTiles(
            kernel,
            q,
            k_caches,
            v_caches,
            out,
            page_ids=tb.page_ids,
            keep=tb.keep,
            num_tiles=tb.num_tiles,
            max_q=tb.max_q,
            num_pages=tb.num_pages,
            key_len=tb.key_len,
            scale=self.scale,
            soft_cap=self.soft_cap,
        )

    def run(self, q: Any, k_cache: Any, v_cache: Any, *, return_lse: bool = False) -> Any:
        """Attention of this batch's queries ``q [total_q, Hq, D]`` over one layer's cache.

        Same result and semantics as :func:`~deepinfer_kernels.paged_attention` with the
        planned metadata and options: ``o`` shaped like ``q`` (and ``lse [total_q, Hq]`` fp32
        when ``return_lse``). Inputs are checked against the plan (shapes, dtypes, device, the
        pool holding every planned block id); the metadata values were checked by the plan.
        """
        convert = result_converter(q, k_cache, v_cache)
        q, k_cache, v_cache = (
            to_torch(q, "q"),
            to_torch(k_cache, "k_cache"),
            to_torch(v_cache, "v_cache"),
        )
        self._check(q, k_cache, v_cache)
        if self.use_triton and self.decode_splits > 1:
            out, lse = self._run_split_k(q, k_cache, v_cache)
        elif self.use_triton:
            from deepinfer_kernels.attention.autograd import with_reference_backward
            from deepinfer_kernels.attention.ops import paged_attention_impl, paged_attention_op

            op = eager_or_op(paged_attention_op, paged_attention_impl)
            args = (q, k_cache, v_cache, self.block_table, self.seq_lens, self.cu_seqlens_q)
            meta = (self.scale, self.causal, self.window, self.soft_cap)
            if torch.compiler.is_compiling():
                out, lse = op(*args, *meta, True)  # the op carries its backward
            else:
                out, lse = with_reference_backward(
                    lambda: op(*args, *meta, True), *args,
                    scale=self.scale, causal=self.causal, window=self.window,
                    soft_cap=self.soft_cap,
                )  # fmt: skip
        else:
            out, lse_opt = run_tile_batches(
                self._batches,
                q,
                k_cache,
                v_cache,
                self.scale,
                self.soft_cap,
                return_lse,
                self.cpu_kernel,
            )
            if not return_lse:
                return convert(out)
            assert lse_opt is not None
            lse = lse_opt
        return (convert(out), convert(lse)) if return_lse else convert(out)

    def _run_split_k(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from deepinfer_kernels.attention.autograd import with_reference_backward
        from deepinfer_kernels.attention.ops import (
            paged_decode_attention_impl,
            paged_decode_attention_op,
        )

        op = eager_or_op(paged_decode_attention_op, paged_decode_attention_impl)
        args = (q, k_cache, v_cache, self.block_table, self.seq_lens)
        meta = (self.scale, self.window, self.soft_cap, self.decode_splits, True)
        if torch.compiler.is_compiling():
            out, lse = op(*args, *meta)
        else:
            out, lse = with_reference_backward(
                lambda: op(*args, *meta), *args, self.cu_seqlens_q,
                scale=self.scale, causal=self.causal, window=self.window,
                soft_cap=self.soft_cap,
            )  # fmt: skip
        return out, lse
