"""The fast index walk (#20 item 8) against straightforward reference walks.

``PrefixIndex.match`` probes with C-level loops and moves touched LRU stretches with one splice
each; ``TieredKVStore.lookup`` hashes lazily outside the lock. Each is checked here against the
plain definition: a block-by-block walk, and an LRU list that moves one node at a time.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from _cache_helpers import BS, PAGE, page_for
from hypothesis import given, settings

from deepinfer_cache import (
    DeviceTier,
    FakeClock,
    HostTier,
    PrefixIndex,
    RetentionPolicy,
    TieredKVStore,
    hash_token_blocks,
)

TTLS = {"chat": 100.0, "agent": 30.0}


def _lru_chain(idx: PrefixIndex, t: int) -> list[int]:
    """Tier ``t``'s LRU ids head to tail, checked against the backward links."""
    fwd = list(idx._lru_ids(t))
    back, i = [], idx._tail[t]
    while i != -1:
        back.append(i)
        i = idx._lru_prev[t][i]
    assert back[::-1] == fwd and len(fwd) == idx.count_in(t)
    return fwd


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_stretch_splice_equals_moving_one_node_at_a_time(data) -> None:
    n = data.draw(st.integers(1, 30))
    keys = [i.to_bytes(16, "little") for i in range(1, n + 1)]
    a, b = PrefixIndex(1), PrefixIndex(1)
    for idx in (a, b):
        for k in keys:  # n roots: any order of them is a valid LRU order
            idx.insert([k], tier=0)
    order = data.draw(st.permutations(keys))
    for idx in (a, b):
        idx.reorder_lru(0, order)
    for _ in range(data.draw(st.integers(1, 4))):
        lru = [a._key(i) for i in _lru_chain(a, 0)]
        kind = data.draw(st.sampled_from(["stretch", "stretches", "any"]))
        if kind == "any":  # arbitrary ids, repeats allowed
            path_keys = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=n + 3))
        else:  # reversed stretches of the current order: the shape a repeated lookup has
            lo = data.draw(st.integers(0, n - 1))
            hi = data.draw(st.integers(lo + 1, n))
            path_keys = lru[lo:hi][::-1]
            if kind == "stretches" and len(path_keys) > 2:
                cut = data.draw(st.integers(1, len(path_keys) - 1))
                path_keys = path_keys[cut:] + path_keys[:cut]
        a._move_to_tail(0, [a._ids[k] for k in path_keys])
        b._move_each_to_tail(0, [b._ids[k] for k in path_keys])
        assert [a._key(i) for i in _lru_chain(a, 0)] == [b._key(i) for i in _lru_chain(b, 0)]
        assert a._head == b._head and a._tail == b._tail


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_match_equals_a_reference_walk_with_lru_model(data) -> None:
    """Random inserts (prefix-sharing chains, three tiers), lookups as lists or iterators,
    clock steps: ``match`` equals a block-by-block walk and every tier's LRU order equals a
    list that moves one block at a time."""
    clock = FakeClock(1000.0)
    idx = PrefixIndex(3, RetentionPolicy(TTLS), clock)
    lru: list[list[bytes]] = [[], [], []]
    vocab = st.lists(st.integers(0, 2), min_size=0, max_size=14)

    def touch(path: list[bytes]) -> None:
        for t in range(3):
            for h in reversed([h for h in path if idx.tiers_of(h) >> t & 1]):
                lru[t].remove(h)
                lru[t].append(h)

    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["insert", "match", "match", "tick"]))
        hs = hash_token_blocks(data.draw(vocab), 2)
        if op == "insert" and hs:
            tier = data.draw(st.integers(0, 2))
            retention = data.draw(st.sampled_from(sorted(TTLS)))
            try:
                idx.insert(hs, tier=tier, retention=retention)
            except ValueError:
                continue  # a prefix of ``hs`` expired and was not re-rooted: not a chain
            for h in hs:
                if h not in lru[tier]:
                    lru[tier].append(h)
            touch(hs)
        elif op == "match":
            now = clock.now()
            want = 0
            for h in hs:
                exp = idx.expires_of(h)
                if exp is None or exp <= now:
                    break
                want += 1
            lazy = data.draw(st.booleans())
            m = idx.match(iter(hs) if lazy else hs)
            assert m.num_blocks == want
            assert m.tiers == tuple(idx.tiers_of(h) for h in hs[:want])
            touch(hs[:want])
        else:
            clock.advance(data.draw(st.sampled_from([1.0, 29.0, 71.0])))
        for t in range(3):
            assert [idx._key(i) for i in _lru_chain(idx, t)] == lru[t]


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_store_lookup_equals_a_reference_walk(data) -> None:
    clock = FakeClock(1000.0)
    store = TieredKVStore(
        [DeviceTier.allocate(PAGE, torch.float32, 6 * 96), HostTier(PAGE, torch.float32, 40 * 96)],
        BS,
        retention=RetentionPolicy(TTLS),
        clock=clock,
        key_hash=data.draw(st.sampled_from(["xxh3_128", "blake2b"])),
    )
    prompts = st.lists(st.integers(0, 3), min_size=0, max_size=5 * BS + 2)
    spaces = st.sampled_from([b"", b"a"])
    try:
        for _ in range(data.draw(st.integers(1, 15))):
            op = data.draw(st.sampled_from(["store", "lookup", "lookup", "tick"]))
            tokens, ns = data.draw(prompts), data.draw(spaces)
            hs = store.hashes(tokens, ns)
            if op == "store":
                pages = torch.stack([page_for(h) for h in hs]) if hs else torch.empty(0, *PAGE)
                store.store(tokens, pages, data.draw(st.sampled_from(sorted(TTLS))), ns)
            elif op == "lookup":
                now = clock.now()
                want = 0
                for h in hs:
                    exp = store.index.expires_of(h)
                    if exp is None or exp <= now:
                        break
                    want += 1
                as_list = data.draw(st.booleans())
                res = store.lookup(
                    tokens if as_list else torch.tensor(tokens, dtype=torch.int64), ns
                )
                assert res.num_blocks == want and res.num_tokens == want * BS
                assert sum(res.blocks_per_tier.values()) == want
                # Hashed up to and including the first block the index lacks, no further.
                absent = [k for k, h in enumerate(hs) if h not in store.index]
                assert res.hashes == (hs[: absent[0] + 1] if absent else hs)
            else:
                clock.advance(data.draw(st.sampled_from([5.0, 31.0, 101.0])))
    finally:
        store.close()
