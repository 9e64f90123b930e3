"""The engine's prefix cache: `deepinfer_cache`'s store over the engine's own KV pool.

`deepinfer_cache.build_pool_cache` builds the tiered store (its device tier a reserved slice
of the pool, host and disk tiers from a `PrefixCacheConfig`) and the adapter over the pool;
`pool_model_key` keys pages by model and page layout. What only the engine knows stays here:
its `KVPool` (where blocks are and how they are reserved) and the kernels that move pages
(`deepinfer_kernels.gather_blocks` / `scatter_blocks`, plugged in at the cache's seam).
"""

from __future__ import annotations

from deepinfer.engine.config import EngineConfig
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer_cache import (
    KVCacheAdapter,
    PrefixCacheConfig,
    TieredKVStore,
    build_pool_cache,
    pool_model_key,
)
from deepinfer_kernels import gather_blocks, scatter_blocks

# `PrefixCacheConfig` lives in `deepinfer_cache`; this import path keeps working.
__all__ = ["PrefixCacheConfig", "build_engine_kv", "build_prefix_cache", "model_cache_key"]


def model_cache_key(model_path: str, pool: KVPool) -> str:
    """Pages are only reusable by the same weights in the same layout and dtype."""
    return pool_model_key(model_path, pool.tensor, pool.block_size)


def build_prefix_cache(
    pool: KVPool, config: PrefixCacheConfig, model_key: str, *, directory_suffix: str = ""
) -> tuple[KVCacheAdapter, TieredKVStore]:
    """`deepinfer_cache.build_pool_cache` over ``pool`` (device tier: up to
    ``config.device_blocks``, at most half, of its blocks) with the kernels that move pages."""
    return build_pool_cache(
        config,
        pool.tensor,
        pool.block_size,
        pool.allocate,
        model_key=model_key,
        gather_fn=gather_blocks,
        scatter_fn=scatter_blocks,
        directory_suffix=directory_suffix,
    )


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
