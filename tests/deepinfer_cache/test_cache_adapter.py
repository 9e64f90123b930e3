"""KVCacheAdapter against an engine-shaped pool [L, 2, num_blocks, block_size, H, D]."""

from __future__ import annotations

import pytest
import torch

from deepinfer_cache import DeviceTier, DiskTier, HostTier, KVCacheAdapter, TieredKVStore

L, BS, H, D, N = 2, 4, 2, 3, 16
RESERVED = [12, 13, 14, 15]  # engine blocks lent to the cache's device tier


def engine_pool(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((L, 2, N, BS, H, D), generator=g)


def make(pool: torch.Tensor, path) -> tuple[TieredKVStore, KVCacheAdapter]:
    page = tuple(pool.select(2, 0).shape)
    tiers = [
        DeviceTier(pool, block_dim=2, block_ids=RESERVED),
        HostTier(page, pool.dtype, 2 * pool.select(2, 0).nbytes),
        DiskTier(path, page, pool.dtype, 1 << 22, fsync=False),
    ]
    store = TieredKVStore(tiers, BS)
    return store, KVCacheAdapter(store, BS)


def test_save_then_load_into_other_blocks(tmp_path) -> None:
    pool = engine_pool()
    store, kv = make(pool, tmp_path)
    tokens = list(range(100, 100 + 5 * BS + 2))  # 5 full blocks + 2 tokens
    src = [0, 1, 2, 3, 4, 5]
    expected = pool[:, :, src[:5]].clone()
    assert kv.num_cached_tokens(tokens) == 0
    assert kv.save(tokens, b"", src) == 5
    assert kv.save(tokens, b"", src) == 0  # nothing new
    assert kv.num_cached_tokens(tokens) == 5 * BS
    assert kv.num_cached_tokens(tokens[: 3 * BS + 1]) == 3 * BS
    dst = [6, 7, 8, 9, 10]
    pool[:, :, dst] = 0
    assert kv.load(tokens, b"", dst) == 5 * BS
    assert torch.equal(pool[:, :, dst], expected)
    assert kv.load(tokens, b"", dst[:2]) == 2 * BS  # limited by the blocks given
    assert kv.load(tokens, b"", []) == 0
    store.close()


def test_restarted_engine_hits_through_disk(tmp_path) -> None:
    pool = engine_pool(1)
    store, kv = make(pool, tmp_path)
    tokens = list(range(7 * BS))
    expected = pool[:, :, :7].clone()
    kv.save(tokens, b"t1", list(range(7)))
    store.close()
    fresh = torch.zeros_like(pool)  # a new process: new pool, same directory
    store2, kv2 = make(fresh, tmp_path)
    assert kv2.num_cached_tokens(tokens, b"t1") == 7 * BS
    assert kv2.num_cached_tokens(tokens, b"t2") == 0
    assert kv2.load(tokens, b"t1", [0, 1, 2, 3, 4, 5, 6]) == 7 * BS
    assert torch.equal(fresh[:, :, :7], expected)
    store2.close()


def test_adapter_argument_checks(tmp_path) -> None:
    pool = engine_pool()
    store, kv = make(pool, tmp_path)
    with pytest.raises(ValueError, match="device_block_ids"):
        kv.load(list(range(8)), b"", [N])
    with pytest.raises(ValueError, match="block_size"):
        KVCacheAdapter(store, BS + 1)
    host_only = TieredKVStore([HostTier((1,), torch.float32, 64)], BS)
    with pytest.raises(ValueError, match="pool"):
        KVCacheAdapter(host_only, BS)
    with pytest.raises(ValueError, match="match"):
        KVCacheAdapter(host_only, BS, pool=pool, block_dim=2)
    store.close()
