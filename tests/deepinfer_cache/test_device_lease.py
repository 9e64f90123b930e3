"""TieredKVStore.lease_device / KVCacheAdapter.share: device-tier blocks read in place."""

from __future__ import annotations

import torch

from deepinfer_cache import DeviceTier, HostTier, KVCacheAdapter, TieredKVStore

BS = 4


def _setup(device_blocks: int) -> tuple[torch.Tensor, TieredKVStore, KVCacheAdapter]:
    pool = torch.randn(2, 2, 16, BS, 1, 3)  # [L, 2, blocks, block_size, H, D]
    tier = DeviceTier(pool, block_dim=2, block_ids=list(range(10, 10 + device_blocks)))
    page = tuple(pool.select(2, 0).shape)
    store = TieredKVStore([tier, HostTier(page, pool.dtype, 1 << 20)], BS)
    return pool, store, KVCacheAdapter(store, BS, pool=pool, block_dim=2)


def test_share_returns_the_device_slots_and_pins_them() -> None:
    pool, store, kv = _setup(device_blocks=3)
    with store:
        tokens = list(range(13))
        assert kv.save(tokens, b"", [0, 1, 2]) == 3
        ids, release = kv.share(tokens, b"", max_blocks=3)
        tier = store.tiers[0]
        assert isinstance(tier, DeviceTier)
        assert ids == [tier.slot_of(h) for h in store.hashes(tokens)[:3]]
        assert torch.equal(pool[:, :, ids], pool[:, :, [0, 1, 2]])  # the saved pages, in place
        pages = pool[:, :, ids].clone()
        # A full device tier with every block pinned: new blocks go elsewhere, never there.
        kv.save(list(range(100, 113)), b"", [3, 4, 5])
        assert torch.equal(pool[:, :, ids], pages)
        assert kv.num_cached_tokens(tokens) == 12
        release()
        release()  # idempotent
        # Unpinned now: the tier may evict them for the next save.
        kv.save(list(range(200, 213)), b"", [6, 7, 8])
        assert not torch.equal(pool[:, :, ids], pages)


def test_share_stops_at_the_first_block_not_on_the_device() -> None:
    _, store, kv = _setup(device_blocks=3)
    with store:
        assert kv.share(list(range(9)), b"", max_blocks=2)[0] == []  # nothing cached
        kv.save(list(range(9)), b"", [0, 1])
        ids, release = kv.share(list(range(9)), b"tenant", max_blocks=2)
        assert ids == []  # another namespace never shares
        release()
        ids, release = kv.share(list(range(9)), b"", max_blocks=1)
        assert len(ids) == 1
        release()


def test_share_needs_a_device_tier_over_the_same_pool() -> None:
    pool = torch.randn(2, 2, 8, BS, 1, 3)
    page = tuple(pool.select(2, 0).shape)
    store = TieredKVStore([HostTier(page, pool.dtype, 1 << 20)], BS)
    with store:
        kv = KVCacheAdapter(store, BS, pool=pool, block_dim=2)
        kv.save(list(range(9)), b"", [0, 1])
        ids, release = kv.share(list(range(9)), b"", max_blocks=2)
        assert ids == []
        release()
