from __future__ import annotations

import os
import random
import threading

import pytest
import torch
from _cache_helpers import BS, PAGE, make_store, page_for, pages_for

from deepinfer_cache import (
    DiskTier,
    FakeClock,
    HostTier,
    TieredKVStore,
    hash_token_blocks,
)
from deepinfer_cache.retention import DAY


def toks(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def check_pages(res, tokens: list[int], ns: bytes = b"") -> None:
    hs = hash_token_blocks(tokens, BS, ns)
    for h, p in zip(hs, res.pages):
        assert torch.equal(p.cpu(), page_for(h))


def test_write_back_demotes_down_the_tiers(tmp_path) -> None:
    store = make_store(tmp_path)
    t = toks(8)
    assert store.store(t, pages_for(t)) == 8
    res = store.lookup([*t, 1, 2])  # the partial block is never counted
    assert res.num_tokens == 8 * BS
    # A chain never evicts its own prefix: it fills the tiers top-down.
    assert res.blocks_per_tier == {"device": 2, "host": 2, "disk": 4}
    b = toks(3, 5000)
    assert store.store(b, pages_for(b)) == 3
    assert store.lookup(b).blocks_per_tier["device"] == 2
    # The older chain moved down; nothing was lost.
    assert store.lookup(t).num_blocks == 8
    check_pages(store.fetch(t).result(), t)
    check_pages(store.fetch(b).result(), b)
    s = store.stats()
    # Evictions of blocks already held lower (e.g. promoted copies) need no demotion.
    assert 2 <= s.demotions <= s.tiers[0].evictions + s.tiers[1].evictions
    assert s.tiers[2].evictions == 0
    store.close()


def test_fetch_promotes_to_the_fast_tier(tmp_path) -> None:
    store = make_store(tmp_path, device_pages=4)
    a, b = toks(3), toks(3, 1000)
    store.store(a, pages_for(a))
    store.store(b, pages_for(b))  # pushes most of `a` out of the device tier
    assert store.lookup(a).blocks_per_tier["device"] < 3
    fut = store.fetch(a)
    res = fut.result(timeout=30)
    check_pages(res, a)
    assert store.lookup(a).blocks_per_tier["device"] == 3
    assert store.stats().promotions >= 1
    store.close()


def test_write_through_puts_every_block_on_disk(tmp_path) -> None:
    store = make_store(tmp_path, write_policy="write-through")
    t = toks(3)
    store.store(t, pages_for(t))
    store.flush()
    disk = store.tiers[2]
    assert isinstance(disk, DiskTier)
    assert all(disk.is_durable(h) for h in hash_token_blocks(t, BS))
    store.close()


def test_restart_hits_via_disk(tmp_path) -> None:
    store = make_store(tmp_path)
    t = toks(6)
    store.store(t, pages_for(t))
    store.close()  # write-back: close persists device/host-only blocks
    store = make_store(tmp_path)
    res = store.lookup(t)
    assert res.num_blocks == 6 and res.blocks_per_tier["disk"] == 6
    check_pages(store.fetch(t).result(), t)
    store.close()


def test_lazy_pages_only_asks_for_new_blocks(tmp_path) -> None:
    store = make_store(tmp_path, disk_pages=None, host_pages=8)
    asked: list[list[int]] = []

    def pages(idx: list[int]) -> torch.Tensor:
        asked.append(idx)
        return pages_for(toks(5))[idx]

    store.store(toks(3), pages_for(toks(3)))
    assert store.store(toks(5), pages) == 2
    assert asked == [[3, 4]]


def test_ttl_expiry_on_every_tier_and_on_reopen(tmp_path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, device_pages=1, host_pages=1, clock=clock)
    chat, agent = toks(3), toks(3, 500)
    store.store(chat, pages_for(chat), retention="chat")
    store.store(agent, pages_for(agent), retention="agent")
    clock.advance(3 * DAY + 60)
    assert store.lookup(agent).num_blocks == 0
    assert store.lookup(chat).num_blocks == 3
    assert store.gc() == 3
    assert all(h not in t for t in store.tiers for h in hash_token_blocks(agent, BS))
    store.close()
    clock.advance(4 * DAY)  # chat is now past 7 days as well
    store = make_store(tmp_path, clock=clock)
    assert store.lookup(chat).num_blocks == 0 and len(store.tiers[2]) == 0
    store.close()


def test_refreshed_expiry_survives_restart(tmp_path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, device_pages=0, host_pages=0, clock=clock)
    t = toks(2)
    store.store(t, pages_for(t), retention="agent")
    store.flush()
    clock.advance(2 * DAY)
    store.store(t, pages_for(t), retention="agent")  # used again: lives 3 more days
    store.close()
    clock.advance(2 * DAY)  # 4 days after the first store, 2 after the refresh
    store = make_store(tmp_path, device_pages=0, host_pages=0, clock=clock)
    assert store.lookup(t).num_blocks == 2
    store.close()


def test_tenants_never_share_blocks(tmp_path) -> None:
    store = make_store(tmp_path, host_pages=16)
    t = toks(4)
    store.store(t, pages_for(t, b"alice"), namespace=b"alice")
    assert store.lookup(t, b"bob").num_blocks == 0
    assert store.lookup(t).num_blocks == 0
    assert store.fetch(t, b"bob").result().num_blocks == 0
    store.store(t, pages_for(t, b"bob"), namespace=b"bob")
    check_pages(store.fetch(t, b"alice").result(), t, b"alice")
    check_pages(store.fetch(t, b"bob").result(), t, b"bob")
    assert len(store.index) == 8
    store.close()


def test_disk_full_evicts_then_skips_and_keeps_durable_blocks(tmp_path) -> None:
    store = make_store(tmp_path, device_pages=0, host_pages=0, disk_pages=3)
    a = toks(5)
    assert store.store(a, pages_for(a)) == 3  # a chain cannot evict its own parent
    assert store.stats().tiers[0].skipped_no_room >= 1
    b = toks(2, 900)
    assert store.store(b, pages_for(b)) == 2  # evicts a's LRU leaves instead
    store.flush()
    assert store.lookup(a).num_blocks == 1
    check_pages(store.fetch(a).result(), a[: BS * 1])
    check_pages(store.fetch(b).result(), b)
    store.close()


def test_pinned_blocks_are_never_evicted(tmp_path) -> None:
    store = make_store(tmp_path, device_pages=2, host_pages=0, disk_pages=None)
    a = toks(2)
    store.store(a, pages_for(a))
    hs = hash_token_blocks(a, BS)
    store.index.pin(hs)
    assert store.store(toks(2, 700), pages_for(toks(2, 700))) == 0
    store.index.unpin(hs)
    assert store.store(toks(2, 700), pages_for(toks(2, 700))) == 2


def test_corrupt_block_is_a_miss_never_served(tmp_path) -> None:
    store = make_store(tmp_path, device_pages=0, host_pages=0)
    t = toks(4)
    store.store(t, pages_for(t))
    path = store.tiers[0].path_of(hash_token_blocks(t, BS)[2])
    store.close()
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x7f")
    store = make_store(tmp_path, device_pages=0, host_pages=0)
    assert store.lookup(t).num_blocks == 4  # the header is intact
    res = store.fetch(t).result()
    assert res.num_blocks == 2
    check_pages(res, t)
    assert store.lookup(t).num_blocks == 2
    s = store.stats()
    assert s.corrupt_quarantined == 1 and s.fetch_failures == 1
    store.close()


def test_threads_store_and_fetch_consistently(tmp_path) -> None:
    store = make_store(tmp_path, device_pages=3, host_pages=5, disk_pages=40)
    prompts = [toks(random.Random(i).randint(1, 6), 64 * (i % 7)) for i in range(12)]
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(40):
                t = rng.choice(prompts)
                op = rng.random()
                if op < 0.4:
                    store.store(t, pages_for(t), retention=rng.choice(["chat", "agent"]))
                elif op < 0.8:
                    check_pages(store.fetch(t).result(timeout=60), t)
                else:
                    assert store.lookup(t).num_tokens <= len(t)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    store.flush()
    for h in store.index.keys_parents_first():
        assert store.index.pins_of(h) == 0
    store.close()


def test_stats_and_cost_report(tmp_path) -> None:
    store = make_store(tmp_path)
    t = toks(4)
    store.lookup(t)  # miss: 16 tokens
    store.store(t, pages_for(t))
    store.lookup(t)  # hit: 16 tokens
    s = store.stats()
    assert (s.lookups, s.query_tokens, s.hit_tokens) == (2, 32, 16)
    assert s.hit_rate == 0.5
    assert sum(ts.hit_blocks for ts in s.tiers) == 4
    rep = store.cost_report(hit_price=0.1, miss_price=5.0)
    assert rep.cost == pytest.approx((16 * 0.1 + 16 * 5.0) / 1e6)
    assert 0 < rep.savings_fraction < 1
    assert s.as_dict()["hit_rate"] == 0.5
    store.close()


def test_bad_arguments(tmp_path) -> None:
    with pytest.raises(ValueError, match="tiers"):
        TieredKVStore([], 4)
    host = HostTier(PAGE, torch.float32, 1 << 12)
    with pytest.raises(ValueError, match="block_size"):
        TieredKVStore([host], 0)
    with pytest.raises(ValueError, match="write_policy"):
        TieredKVStore([host], 4, write_policy="sometimes")
    with pytest.raises(ValueError, match="page_shape"):
        TieredKVStore([host, HostTier((1,), torch.float32, 64)], 4)
    store = TieredKVStore([host], BS)
    with pytest.raises(ValueError, match="pages"):
        store.store(toks(3), pages_for(toks(2)))
    with pytest.raises(ValueError, match="retention"):
        store.store(toks(1), pages_for(toks(1)), retention="forever")
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.store(toks(1), pages_for(toks(1)))
