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

One concept per module: this one validates the metadata and plans (:func:`plan_paged_attention`);
``paged_attention_plan.py`` holds the plan object and its per-layer run.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from deepinfer_kernels._dispatch import should_use_triton
from deepinfer_kernels._interop import to_torch
from deepinfer_kernels.attention.paged_attention_plan import PagedAttentionPlan
from deepinfer_kernels.attention.splits import decode_split_count
from deepinfer_kernels.attention.torch_path import default_scale, plan_tile_batches
from deepinfer_kernels.attention.validate import (
    PagedShape,
    check_options,
    check_paged_values,
    want_value_checks,
)
from deepinfer_kernels.cpu.attention import MAX_BATCH_TILE_Q, PagedAttentionTiles

__all__ = ["PagedAttentionPlan", "plan_paged_attention"]

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
