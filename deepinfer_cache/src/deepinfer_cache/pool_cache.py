"""The prefix cache over an engine's paged KV pool, its device tier a slice of that pool.

An engine keeps its KV in one tensor whose ``block_dim`` indexes blocks. The cache's device
tier is a reserved slice of those blocks (cached pages stay where attention reads them, and a
device hit can share a block instead of copying it); pages move with the gather / scatter
functions the engine passes in (this package imports no kernel library; the defaults are
plain torch indexing). Pages are only reusable by the same weights in the same page layout
and dtype, so :func:`pool_model_key` derives the model key from both. Example::

    pool = torch.zeros(2, 2, 64, 16, 2, 8)  # [layers, K/V, blocks, block_size, heads, dim]
    free = list(range(64))
    adapter, store = build_pool_cache(
        PrefixCacheConfig(device_blocks=8, host_bytes=1 << 20, disk_bytes=0),
        pool, 16, lambda n: [free.pop() for _ in range(n)],
        model_key=pool_model_key("my-model", pool, 16),
    )
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch

from .adapter import KVCacheAdapter
from .config import PrefixCacheConfig, build_store
from .store import TieredKVStore
from .tiers.base import GatherFn, ScatterFn
from .tiers.device import DeviceTier


def pool_model_key(
    model_id: str, pool: torch.Tensor, block_size: int, *, block_dim: int = 2
) -> str:
    """A short key naming ``model_id``'s pages in ``pool``'s layout (page shape, dtype, block
    size): two pools that differ in any of them never read each other's pages."""
    shape = "x".join(str(s) for s in pool.select(block_dim, 0).shape)
    raw = f"{model_id}|{shape}|{pool.dtype}|{block_size}"
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def build_pool_cache(
    config: PrefixCacheConfig,
    pool: torch.Tensor,
    block_size: int,
    reserve: Callable[[int], Sequence[int]],
    *,
    model_key: str,
    block_dim: int = 2,
    gather_fn: GatherFn | None = None,
    scatter_fn: ScatterFn | None = None,
    directory_suffix: str = "",
) -> tuple[KVCacheAdapter, TieredKVStore]:
    """A `KVCacheAdapter` over ``pool`` and the store behind it (close the store on shutdown).

    The device tier takes ``reserve(n)`` blocks of the pool, ``n`` = ``config.device_blocks``
    up to half the pool (the engine keeps the rest to run on); ``model_key`` and
    ``directory_suffix`` as in :func:`build_store`."""
    device = None
    if config.device_blocks:
        num_blocks = pool.shape[block_dim]
        device = DeviceTier(
            pool,
            block_dim=block_dim,
            block_ids=list(reserve(min(config.device_blocks, num_blocks // 2))),
            gather_fn=gather_fn,
            scatter_fn=scatter_fn,
        )
    store = build_store(
        config,
        pool.select(block_dim, 0).shape,
        pool.dtype,
        block_size,
        model_key=model_key,
        device_tier=device,
        directory_suffix=directory_suffix,
    )
    adapter = KVCacheAdapter(
        store,
        block_size,
        pool=pool,
        block_dim=block_dim,
        gather_fn=gather_fn,
        scatter_fn=scatter_fn,
    )
    return adapter, store
