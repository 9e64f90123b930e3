"""Plan / run split of :func:`~deepinfer_kernels.paged_attention` (FlashInfer style).

A model calls paged attention once per layer with the same batch metadata (block table,
lengths, query offsets) and a different KV cache. :func:`plan_paged_attention` validates the
metadata once and precomputes everything that does not depend on the layer (tiles, page ids,
padded query rows, the additive mask, output rows); :meth:`PagedAttentionPlan.run` then does
only the per-layer work: gather the pages, attend, write back. ``run(q, k, v)`` equals
``paged_attention(q, k, v, *metadata, **options)`` exactly (the public op is plan + run).

Example::

    import torch
    from deepinfer_kernels import plan_paged_attention

    plan = plan_paged_attention(
        torch.tensor([[3, 1], [5, 0]], dtype=torch.int32),  # block_table
        torch.tensor([20, 9], dtype=torch.int32),  # seq_lens
        torch.tensor([0, 1, 3], dtype=torch.int32),  # cu_seqlens_q
        block_size=16, num_q_heads=4, num_kv_heads=2, head_dim=64,
    )
    for layer in range(2):  # one plan, every layer
        k, v = torch.randn(8, 16, 2, 64), torch.randn(8, 16, 2, 64)
        out = plan.run(torch.randn(3, 4, 64), k, v)

On the Triton path (CUDA tensors, or forced) the plan keeps the validated metadata and picks
the launch: a decode batch (one query per sequence) that would give the GPU too few programs
runs the split-K decode kernel (keys cut into :attr:`PagedAttentionPlan.decode_splits` chunks
from the real lengths, merged by log-sum-exp), everything else the unified kernel, which plans
its tiles on the device itself; no host sync happens at run time. ``run`` is meant for eager execution; under ``torch.compile`` call the registered op
:func:`~deepinfer_kernels.paged_attention` instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.attention.splits import decode_split_count
from deepinfer_kernels.attention.torch_path import (
    TileBatch,
    default_scale,
    plan_tile_batches,
    run_tile_batches,
)
from deepinfer_kernels.attention.validate import (
    ATTN_DTYPES,
    PagedShape,
    check_options,
    check_paged_values,
    want_value_checks,
)
from deepinfer_kernels.cpu.attention import MAX_BATCH_TILE_Q, BoundTiles, PagedAttentionTiles

# Pool size used while validating the metadata alone: the real pool is only known at run time,
# where the largest block id in use is checked against it. (The int32 maximum: a larger Python
# int would overflow in the comparison with the int32 table.)
_ANY_POOL = torch.iinfo(torch.int32).max


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    return value


def _index(x: Any, name: str, shape: tuple[int, ...] | None, device: torch.device) -> torch.Tensor:
    t: torch.Tensor = to_torch(x, name)
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    return t


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


def _split_option(split_k: object) -> int | None:
    if split_k is None:
        return None
    if isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1:
        raise ValueError(f"split_k: expected None or an int >= 1, got {split_k!r}")
    return split_k


def plan_paged_attention(
    block_table: Any,
    seq_lens: Any,
    cu_seqlens_q: Any,
    *,
    block_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    causal: bool = True,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    scale: float | None = None,
    device: torch.device | str | None = None,
    use_triton: bool | None = None,
    check_values: bool = True,
    cpu_kernel: PagedAttentionTiles | None = None,
    split_k: int | None = None,
) -> PagedAttentionPlan:
    """Validate paged-attention metadata once and precompute its layer-independent work.

    Arguments follow :func:`~deepinfer_kernels.paged_attention` (``block_table`` int32
    ``[batch, max_blocks]``, ``seq_lens`` int32 ``[batch]``, ``cu_seqlens_q`` int32
    ``[batch + 1]``), with the cache's static sizes given explicitly. ``device`` defaults to
    ``block_table``'s; the metadata must live there. Bad metadata raises ``ValueError`` naming
    the argument, as the op does (negative lengths, ``q_len > seq_len``, ``seq_lens`` beyond
    the block table's capacity, negative block ids in use; ids beyond the pool are caught by
    :meth:`PagedAttentionPlan.run`, which sees the pool). ``check_values=False`` skips the
    data-dependent checks on the Triton path (they cost a host sync); the torch path reads the
    metadata anyway and always checks it.

    ``cpu_kernel``: a :class:`~deepinfer_kernels.cpu.PagedAttentionTiles` the torch path runs
    its short tiles (decode, verification) on when the tensors are contiguous fp32 CPU ones;
    ``None`` keeps gather + SDPA everywhere.

    ``split_k`` (Triton path): ``None`` picks from the real lengths (split-K decode when every
    sequence has one query and the batch's ``batch * num_kv_heads`` programs are too few for
    the GPU, see ``attention/splits.py``; with ``check_values=False`` the lengths are not read
    and the unified kernel runs); ``1`` always runs the unified kernel; ``n >= 2`` runs split-K
    decode with ``n`` chunks, which needs one query per sequence (checked from the metadata, or
    only from ``q``'s row count at run time when value checks are off). The torch path ignores it.
    """
    block_size = _positive_int(block_size, "block_size")
    if block_size & (block_size - 1):
        raise ValueError(f"block_size: expected a power of two, got {block_size}")
    num_q_heads = _positive_int(num_q_heads, "num_q_heads")
    num_kv_heads = _positive_int(num_kv_heads, "num_kv_heads")
    head_dim = _positive_int(head_dim, "head_dim")
    if num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads: {num_q_heads} must be a multiple of num_kv_heads {num_kv_heads}"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal)!r}")
    user_scale, window, cap = check_options(scale, sliding_window, soft_cap)
    bt: torch.Tensor = to_torch(block_table, "block_table")
    if bt.dim() != 2:
        raise ValueError(f"block_table: expected [batch, max_blocks], got shape {tuple(bt.shape)}")
    dev = bt.device if device is None else torch.device(device)
    bt = _index(bt, "block_table", None, dev)
    batch = bt.shape[0]
    lens_t = _index(seq_lens, "seq_lens", (batch,), dev)
    cu_t = _index(cu_seqlens_q, "cu_seqlens_q", (batch + 1,), dev)
    triton = should_use_triton(dev, use_triton)
    forced = _split_option(split_k)
    common: dict[str, Any] = {
        "block_table": bt,
        "seq_lens": lens_t,
        "cu_seqlens_q": cu_t,
        "block_size": block_size,
        "num_q_heads": num_q_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "scale": default_scale(head_dim, user_scale),
        "causal": causal,
        "window": window,
        "soft_cap": cap,
        "use_triton": triton,
    }
    if triton and not want_value_checks(check_values):
        return PagedAttentionPlan(
            **common, total_q=None, max_block_id=-1, batches=[], decode_splits=forced or 1
        )
    total_q = int(cu_t[-1]) if batch else 0
    shape = PagedShape(
        batch, total_q, num_q_heads, num_kv_heads, head_dim, _ANY_POOL, block_size, bt.shape[1]
    )
    check_paged_values(shape, bt, lens_t, cu_t, causal=causal)
    used = (lens_t.long() + block_size - 1) // block_size
    in_use = torch.arange(bt.shape[1], device=dev)[None, :] < used[:, None]
    max_id = int(torch.where(in_use, bt, -1).max()) if bt.numel() else -1
    lens = lens_t.tolist()
    splits = 1
    if triton:
        cu = cu_t.tolist()
        q_lens = [hi - lo for lo, hi in itertools.pairwise(cu)]
        if forced is None:
            splits = decode_split_count(q_lens, lens, num_kv_heads, window)
        elif forced > 1 and any(n != 1 for n in q_lens):
            raise ValueError(
                f"split_k: split-K decode needs one query per sequence, got query lengths "
                f"{q_lens[:8]}{'...' if len(q_lens) > 8 else ''}"
            )
        else:
            splits = forced
    batches = (
        []
        if triton
        else plan_tile_batches(
            bt,
            lens,
            cu_t.tolist(),
            block_size=block_size,
            num_q_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            causal=causal,
            window=window,
            soft_cap=cap,
            # With the compiled kernel, short prompts' prefill tiles share one call per layer.
            batch_q=MAX_BATCH_TILE_Q if cpu_kernel is not None else 0,
        )
    )
    return PagedAttentionPlan(
        **common,
        total_q=total_q,
        max_block_id=max_id,
        batches=batches,
        cpu_kernel=cpu_kernel,
        decode_splits=splits,
    )
