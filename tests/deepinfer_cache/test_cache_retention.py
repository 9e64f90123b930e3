"""Retention (#20 item 6): unknown classes survive a reopen, counters name what happened, a
hit refreshes the TTL, expiry is incremental."""

from __future__ import annotations

import pytest
import torch
from _cache_helpers import BS, PAGE, make_store, pages_for

from deepinfer_cache import DiskTier, FakeClock, PrefixIndex, RetentionPolicy, TieredKVStore
from deepinfer_cache.retention import DAY


def toks(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def disk_store(path, clock, retention=None, **kw) -> TieredKVStore:
    return TieredKVStore(
        [DiskTier(path, PAGE, torch.float32, 1 << 20, fsync=False)],
        BS,
        clock=clock,
        retention=retention,
        **kw,
    )


def test_unknown_class_on_reopen_is_kept_with_a_warning(tmp_path) -> None:
    clock = FakeClock()
    wide = RetentionPolicy({"chat": 7 * DAY, "agent": 3 * DAY, "batch": 1 * DAY})
    t = toks(3)
    with disk_store(tmp_path, clock, wide) as store:
        store.store(t, pages_for(t), retention="batch")
    with pytest.warns(RuntimeWarning, match="batch"):
        store = disk_store(tmp_path, clock)  # the default policy has no "batch"
    assert store.lookup(t).num_blocks == 3
    assert store.stats().unknown_class_blocks == 3 and store.stats().expired == 0
    res = store.fetch(t).result()  # a hit cannot refresh a class the policy does not know
    assert res.num_blocks == 3
    clock.advance(DAY + 1)  # past the stored expiry: now it goes
    assert store.lookup(t).num_blocks == 0
    assert store.gc() == 3
    store.close()


def test_reopen_counts_expired_subtrees_as_expired_not_orphans(tmp_path) -> None:
    clock = FakeClock()
    with disk_store(tmp_path, clock) as store:
        store.store(toks(3), pages_for(toks(3)), retention="agent")
        store.store(toks(2, 500), pages_for(toks(2, 500)), retention="chat")
    clock.advance(4 * DAY)
    store = disk_store(tmp_path, clock)
    st = store.stats()
    assert (st.expired, st.orphans_removed) == (3, 0)
    assert store.lookup(toks(2, 500)).num_blocks == 2
    store.close()


@pytest.mark.parametrize("refresh_on_hit", [True, False])
def test_a_hit_refreshes_the_ttl_and_the_refresh_survives_restart(
    tmp_path, refresh_on_hit: bool
) -> None:
    clock = FakeClock()
    t = toks(2)
    store = disk_store(tmp_path, clock, refresh_on_hit=refresh_on_hit)
    store.store(t, pages_for(t), retention="agent")
    clock.advance(2 * DAY)
    assert store.fetch(t).result().num_blocks == 2  # read, not stored again
    store.close()
    clock.advance(2 * DAY)  # 4 days after the store, 2 after the read
    store = disk_store(tmp_path, clock)
    assert store.lookup(t).num_blocks == (2 if refresh_on_hit else 0)
    store.close()


def test_expiry_is_incremental() -> None:
    clock = FakeClock()
    idx = PrefixIndex(1, RetentionPolicy({"short": 10.0, "long": 1000.0}), clock)
    short = [bytes([i]) * 16 for i in range(20)]
    for k in short:
        idx.insert([k], 0, "short")
    longs = [bytes([100 + i]) * 16 for i in range(5)]
    for k in longs:
        idx.insert([k], 0, "long")
    idx.refresh(short[:2], "long")  # these two were used again: they stay
    clock.advance(11)
    first = idx.expire(limit=5)
    assert len(first) == 5
    rest = idx.expire()
    assert {d.key for d in first + rest} == set(short[2:])
    assert idx.expire() == [] and len(idx) == 7


def test_store_gc_drops_everything_expired_in_steps(tmp_path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, device_pages=0, host_pages=64, disk_pages=None, clock=clock)
    for p in range(30):
        store.store(toks(2, 1000 * p), pages_for(toks(2, 1000 * p)), retention="agent")
    clock.advance(3 * DAY + 1)
    assert store.gc() == 60 and len(store.index) == 0
    assert store.stats().expired == 60
    store.close()
