"""Metrics, the block event stream, and tenant deletion / clearing (#20 item 9)."""

from __future__ import annotations

import os

import torch
from _cache_helpers import BS, PAGE, PAGE_BYTES, make_store, pages_for

from deepinfer_cache import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DiskTier,
    FakeClock,
    HostTier,
    TieredKVStore,
    hash_token_blocks,
)
from deepinfer_cache.retention import DAY


def toks(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def test_events_follow_stores_evictions_expiry_and_clear(tmp_path) -> None:
    clock = FakeClock()
    store = TieredKVStore([HostTier(PAGE, torch.float32, 4 * PAGE_BYTES)], BS, clock=clock)
    sub = store.subscribe()
    a, b = toks(3), toks(3, 500)
    store.store(a, pages_for(a))
    store.store(toks(4), pages_for(toks(4)))  # one more block under a
    ev = sub.poll()
    ha = hash_token_blocks(toks(4), BS)
    assert ev == [
        BlockStored(tuple(ha[:3]), None, BS, "chat"),
        BlockStored((ha[3],), ha[2], BS, "chat"),
    ]
    store.store(b, pages_for(b), retention="agent")  # the tier holds 4: a's leaves are evicted
    ev = sub.poll()
    assert isinstance(ev[-1], BlockStored)
    removed = [k for e in ev if isinstance(e, BlockRemoved) for k in e.hashes]
    assert all(e.reason == "evicted" for e in ev if isinstance(e, BlockRemoved))
    assert set(removed) == set(ha) - set(store.block_hashes())
    # A router that mirrors the events holds exactly what the store holds.
    mirror = set()
    for e in [BlockStored(tuple(ha), None, BS, "chat"), *ev]:
        if isinstance(e, BlockStored):
            mirror |= set(e.hashes)
        elif isinstance(e, BlockRemoved):
            mirror -= set(e.hashes)
    assert mirror == set(store.block_hashes())
    clock.advance(3 * DAY + 1)
    store.gc()
    ev = sub.poll()
    assert ev and all(isinstance(e, BlockRemoved) and e.reason == "expired" for e in ev)
    store.clear()
    assert sub.poll()[-1] == AllBlocksCleared() and store.block_hashes() == []
    sub.close()
    store.store(a, pages_for(a))
    assert sub.poll() == []  # unsubscribed
    store.close()


def test_a_slow_consumer_overflows_instead_of_stalling_the_store() -> None:
    store = TieredKVStore([HostTier(PAGE, torch.float32, 64 * PAGE_BYTES)], BS)
    sub = store.subscribe(maxlen=3)
    for p in range(10):
        store.store(toks(1, 100 * p), pages_for(toks(1, 100 * p)))
    assert sub.overflowed and sub.dropped == 7
    assert len(sub.poll()) == 3
    store.close()


def test_prometheus_counters(tmp_path) -> None:
    store = make_store(tmp_path, device_pages=2, host_pages=2)
    t = toks(6)
    store.store(t, pages_for(t))
    store.store(toks(2, 700), pages_for(toks(2, 700)))  # evicts t's first blocks downwards
    store.lookup(t)
    store.fetch(t).result()
    text = store.stats().prometheus()
    lines = dict(ln.rsplit(" ", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))
    assert float(lines["deepinfer_cache_lookups_total"]) == 1
    assert float(lines["deepinfer_cache_hit_tokens_total"]) == 6 * BS
    assert float(lines['deepinfer_cache_tier_evictions_total{tier="device"}']) >= 2
    assert 'deepinfer_cache_tier_hit_blocks_total{tier="disk"}' in lines
    assert "deepinfer_cache_writeback_dropped_total" in lines
    assert "# TYPE deepinfer_cache_lookups_total counter" in text
    st = store.stats()
    assert sum(t.hit_blocks for t in st.tiers) == 6 and st.demotions >= 2
    store.close()


def test_delete_namespace_removes_one_tenant_live_and_after_restart(tmp_path) -> None:
    t = toks(3)
    store = make_store(tmp_path, device_pages=2, host_pages=2)
    for ns in (b"alice", b"bob"):
        store.store(t, pages_for(t, ns), namespace=ns)
        store.store(toks(2, 900), pages_for(toks(2, 900), ns), namespace=ns)
    store.close()  # everything goes to disk; reopening must still know whose blocks are whose
    store = make_store(tmp_path, device_pages=2, host_pages=2)
    sub = store.subscribe()
    assert store.delete_namespace(b"alice") == 5
    assert store.lookup(t, b"alice").num_blocks == 0
    assert store.lookup(t, b"bob").num_blocks == 3
    assert all(isinstance(e, BlockRemoved) and e.reason == "deleted" for e in sub.poll())
    store.flush()
    disk = store.tiers[2]
    assert isinstance(disk, DiskTier)
    on_disk = {
        bytes.fromhex(n)
        for d in os.listdir(tmp_path / "blocks")
        for n in os.listdir(tmp_path / "blocks" / d)
    }
    assert on_disk == set(disk.keys()) and len(on_disk) == 5  # alice's files are gone
    assert store.clear() == 5
    store.flush()
    assert not any(os.listdir(tmp_path / "blocks" / d) for d in os.listdir(tmp_path / "blocks"))
    store.close()


def test_blocks_in_use_survive_delete_and_clear_until_released() -> None:
    store = TieredKVStore([HostTier(PAGE, torch.float32, 16 * PAGE_BYTES)], BS)
    t = toks(3)
    store.store(t, pages_for(t, b"alice"), namespace=b"alice")
    store.store(toks(4), pages_for(toks(4), b"alice"), namespace=b"alice")  # one block deeper
    hs = store.hashes(t, b"alice")
    assert store.index.pin(hs[:2]) == 2  # e.g. an engine reading them in place
    sub = store.subscribe()
    assert store.delete_namespace(b"alice") == 2  # the unpinned blocks below the pinned ones
    assert store.lookup(t, b"alice").num_blocks == 2
    assert store.clear() == 0 and not any(isinstance(e, AllBlocksCleared) for e in sub.poll())
    store.index.unpin(hs[:2])
    assert store.clear() == 2 and sub.poll()[-1] == AllBlocksCleared()
    assert store.block_hashes() == []
    store.close()
