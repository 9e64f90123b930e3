"""The index keeps no per-block object the cyclic GC must visit (#20 item 8), and a lookup that
misses on the first block hashes only that block."""

from __future__ import annotations

import gc

import torch
from _cache_helpers import BS, PAGE, PAGE_BYTES

import deepinfer_cache.store_reads as store_mod
from deepinfer_cache import HostTier, PrefixIndex, TieredKVStore, hash_token_blocks


def test_index_adds_no_gc_tracked_objects_per_block() -> None:
    # Warm up on a throwaway index first: the first insert in a process imports what it uses
    # lazily (numpy.random among them: ~650 tracked objects), a one-off cost, not a per-block
    # one. Without it the test failed whenever it was the first in its process (run alone, or
    # first on an xdist worker) to insert into an index.
    warm = PrefixIndex(3)
    warm.insert(hash_token_blocks(list(range(4 * 4)), 4), tier=0)
    warm.expire()
    del warm
    idx = PrefixIndex(3)
    gc.collect()
    before = len(gc.get_objects())
    n = 0
    for c in range(200):
        hs = hash_token_blocks(list(range(c * 10_000, c * 10_000 + 50 * 4)), 4)
        idx.insert(hs, tier=c % 3)
        n += len(hs)
    idx.expire()  # nothing expired: touches only the heap top
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert n == 10_000 and len(idx) == n
    assert grown < 100, f"{grown} tracked objects for {n} blocks"


def test_first_block_miss_hashes_one_block(monkeypatch) -> None:
    calls = []
    real = store_mod.hash_chunks  # lookup hashes in chunks of 1, 2, 4... blocks

    def counting(*a, **kw):
        for chunk in real(*a, **kw):
            calls.extend(chunk)
            yield chunk

    monkeypatch.setattr(store_mod, "hash_chunks", counting)
    store = TieredKVStore([HostTier(PAGE, torch.float32, 8 * PAGE_BYTES)], BS)
    res = store.lookup(list(range(1000 * BS)))
    assert res.num_blocks == 0 and len(calls) == 1 and len(res.hashes) == 1
    store.close()


def test_store_keeps_no_recovered_block_objects_after_reopen(tmp_path) -> None:
    from _cache_helpers import pages_for

    from deepinfer_cache import DiskTier

    tokens = list(range(6 * BS))
    with TieredKVStore([DiskTier(tmp_path, PAGE, torch.float32, 1 << 20, fsync=False)], BS) as s:
        s.store(tokens, pages_for(tokens))
    disk = DiskTier(tmp_path, PAGE, torch.float32, 1 << 20, fsync=False)
    assert len(disk.recovered()) == 6
    store = TieredKVStore([disk], BS)
    assert store.lookup(tokens).num_blocks == 6
    assert disk.recovered() == []  # the index holds them now
    store.close()
