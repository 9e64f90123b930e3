"""``index_bulk.bulk_load`` builds the index the block-by-block ``rebuild_index`` builds: same
blocks, parents, children, tiers, expiries, classes, LRU order (up to ties), same orphans
and expired counts, on random forests with missing parents, expired blocks, unknown
classes, tenants and parent cycles."""

from __future__ import annotations

import random

import hypothesis.strategies as st
from hypothesis import given, settings

from deepinfer_cache.clock import FakeClock
from deepinfer_cache.index import PrefixIndex
from deepinfer_cache.index_bulk import RecoveredColumns
from deepinfer_cache.meta import BlockMeta, RecoveredBlock
from deepinfer_cache.recovery import rebuild_index

NOW = 1_000_000.0


class FakeTier:
    """A durable tier that hands over blocks one by one, or as columns."""

    def __init__(self, blocks: list[RecoveredBlock], columns: bool) -> None:
        self.blocks = {b.key: b for b in blocks}
        self.deleted: list[bytes] = []
        if columns:
            self.recovered_columns = self._columns

    def recovered(self) -> list[RecoveredBlock]:
        return list(self.blocks.values())

    def _columns(self) -> RecoveredColumns:
        bs = list(self.blocks.values())
        return RecoveredColumns(
            [b.key for b in bs],
            [b.meta.parent for b in bs],
            [b.meta.retention for b in bs],
            [max(b.meta.expires_at, b.mtime) for b in bs],
            [b.meta.tenant for b in bs],
        )

    def delete(self, key: bytes) -> None:
        self.deleted.append(key)
        self.blocks.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self.blocks


def forest(seed: int, n: int) -> list[RecoveredBlock]:
    rng = random.Random(seed)
    keys = [rng.randbytes(16) for _ in range(n)]
    blocks: list[RecoveredBlock] = []
    for i, k in enumerate(keys):
        roll = rng.random()
        if i == 0 or roll < 0.15:
            parent = None
        elif roll < 0.2:
            parent = rng.randbytes(16)  # never landed: an orphaned chain
        elif roll < 0.23:
            parent = keys[rng.randrange(i, n)]  # a later block: may close a cycle
        else:
            parent = keys[rng.randrange(max(0, i - 5), i)]
        expires = NOW + rng.choice([-50.0, 30.0, 30.0, 90.0, 5000.0])
        ret = rng.choice(["chat", "chat", "agent", "legacy"])
        tenant = rng.randbytes(16) if parent is None and rng.random() < 0.5 else None
        blocks.append(RecoveredBlock(k, BlockMeta(parent, ret, expires, tenant), expires))
    rng.shuffle(blocks)
    return blocks


def state(idx: PrefixIndex, tier: int):
    keys = set(idx.keys_parents_first())
    return {
        k: (
            idx.parent_of(k),
            frozenset(idx.children_of(k)),
            idx.tiers_of(k),
            idx.expires_of(k),
            idx.retention_of(k),
        )
        for k in keys
    }


def depth(idx: PrefixIndex, k: bytes) -> int:
    d = 0
    while (k := idx.parent_of(k)) is not None:  # type: ignore[assignment]
        d += 1
    return d


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 120), tier=st.integers(0, 2))
def test_bulk_load_matches_block_by_block_rebuild(seed: int, n: int, tier: int) -> None:
    slow_tier = FakeTier(forest(seed, n), columns=False)
    fast_tier = FakeTier(forest(seed, n), columns=True)
    slow, fast = PrefixIndex(num_tiers=3), PrefixIndex(num_tiers=3)
    r_slow = rebuild_index(slow, tier, slow_tier, NOW)
    r_fast = rebuild_index(fast, tier, fast_tier, NOW)
    assert state(fast, tier) == state(slow, tier)
    assert (r_fast.orphans, r_fast.expired) == (r_slow.orphans, r_slow.expired)
    assert (r_fast.unknown_blocks, r_fast.unknown_classes) == (
        r_slow.unknown_blocks,
        r_slow.unknown_classes,
    )
    assert r_fast.tenants == r_slow.tenants
    assert sorted(fast_tier.deleted) == sorted(slow_tier.deleted)
    lru = fast.keys_in(tier)
    assert set(lru) == set(slow.keys_in(tier)) and fast.count_in(tier) == len(lru)
    ranks = [(fast.expires_of(k), -depth(fast, k)) for k in lru]
    assert ranks == sorted(ranks)  # older first, deeper first on ties
    for other in range(3):
        if other != tier:
            assert fast.count_in(other) == 0 and fast.keys_in(other) == []


def test_bulk_loaded_index_keeps_working() -> None:
    """Insert, match, evict and expire on a bulk-loaded index, as on any other."""
    tier = FakeTier(forest(7, 200), columns=True)
    idx = PrefixIndex(num_tiers=2, clock=FakeClock(NOW))
    rebuild_index(idx, 1, tier, NOW)
    assert len(idx) > 0
    some = idx.keys_in(1)[-1]
    chain = [some]
    while (p := idx.parent_of(chain[0])) is not None:
        chain.insert(0, p)
    assert idx.match(chain, touch=True).num_blocks == len(chain)
    idx.insert([b"\x01" * 16, b"\x02" * 16], tier=0, retention="chat")
    victim = idx.pick_victim(1)
    assert victim is not None
    dropped = idx.expire(NOW + 10**6)
    assert {d.key for d in dropped} >= set(chain) and len(idx) == 0
