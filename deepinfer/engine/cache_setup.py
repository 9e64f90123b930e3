"""The engine's prefix cache: `deepinfer_cache`'s store over the engine's own KV pool.

`deepinfer_cache.build_store` turns a `PrefixCacheConfig` into the tiered store (host and disk
tiers, the disk directory and its format, block-key material, the warnings of an unusable
directory; see `deepinfer_cache.config`). What only the engine knows stays here: the device
tier is a reserved slice of the engine's KV pool (cached pages stay where attention can read
them), pages move with `deepinfer_kernels.gather_blocks` / `scatter_blocks` plugged in at the
cache's seam, and the model key is derived from the model path and the pool's layout.
"""

from __future__ import annotations

import hashlib

from deepinfer.engine.config import EngineConfig
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer_cache import (
    DeviceTier,
    KVCacheAdapter,
    PrefixCacheConfig,
    TieredKVStore,
    build_store,
)
from deepinfer_kernels import gather_blocks, scatter_blocks

# `PrefixCacheConfig` lives in `deepinfer_cache`; this import path keeps working.
__all__ = ["PrefixCacheConfig", "build_engine_kv", "build_prefix_cache", "model_cache_key"]


def model_cache_key(model_path: str, pool: KVPool) -> str:
    """Pages are only reusable by the same weights in the same layout and dtype."""
    shape = "x".join(str(s) for s in pool.tensor.select(2, 0).shape)
    raw = f"{model_path}|{shape}|{pool.tensor.dtype}|{pool.block_size}"
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def build_prefix_cache(
    pool: KVPool, config: PrefixCacheConfig, model_key: str, *, directory_suffix: str = ""
) -> tuple[KVCacheAdapter, TieredKVStore]:
    """A `KVCacheAdapter` over ``pool`` and the store behind it (close it on shutdown).

    The device tier takes up to ``config.device_blocks`` (at most half) of the pool's blocks;
    ``model_key`` and ``directory_suffix`` as in `deepinfer_cache.build_store`."""
    device = None
    if config.device_blocks:
        reserved = pool.allocate(min(config.device_blocks, pool.num_blocks // 2))
        device = DeviceTier(
            pool.tensor,
            block_dim=2,
            block_ids=reserved,
            gather_fn=gather_blocks,
            scatter_fn=scatter_blocks,
        )
    store = build_store(
        config,
        pool.tensor.select(2, 0).shape,
        pool.tensor.dtype,
        pool.block_size,
        model_key=model_key,
        device_tier=device,
        directory_suffix=directory_suffix,
    )
    adapter = KVCacheAdapter(
        store,
        pool.block_size,
        pool=pool.tensor,
        block_dim=2,
        gather_fn=gather_blocks,
        scatter_fn=scatter_blocks,
    )
    return adapter, store


def build_engine_kv(
    model: LlamaModel,
    engine: EngineConfig,
    cache: PrefixCacheConfig | None,
    model_path: str,
    *,
    directory_suffix: str = "",
) -> tuple[KVPool, KVCacheAdapter | None, TieredKVStore | None]:
    """The KV pool an engine over ``model`` runs on and, when ``cache`` is given, the prefix
    cache over that pool (keyed by ``model_path``; ``directory_suffix`` as in
    :func:`build_prefix_cache`); pass both to `LLMEngine`."""
    pool = KVPool.for_weights(model, engine.num_blocks, engine.block_size)
    if cache is None:
        return pool, None, None
    adapter, store = build_prefix_cache(
        pool, cache, model_cache_key(model_path, pool), directory_suffix=directory_suffix
    )
    return pool, adapter, store
