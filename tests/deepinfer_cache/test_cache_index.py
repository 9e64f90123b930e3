from __future__ import annotations

import pytest

from deepinfer_cache import FakeClock, PrefixIndex, RetentionPolicy, hash_token_blocks
from deepinfer_cache.retention import DAY


def chain(n: int, start: int = 0, ns: bytes = b"") -> list[bytes]:
    return hash_token_blocks(list(range(start, start + 4 * n)), 4, ns)


def test_match_reports_tiers_and_stops_at_first_miss() -> None:
    idx = PrefixIndex(3)
    hs = chain(5)
    idx.insert(hs[:3], tier=2)
    idx.add_tier(hs[0], 0)
    m = idx.match(hs)
    assert m.num_blocks == 3
    assert m.tiers == (0b101, 0b100, 0b100)
    assert m.blocks_in(0) == 1 and m.blocks_in(2) == 3
    assert idx.match([]).num_blocks == 0


def test_insert_requires_a_chain() -> None:
    idx = PrefixIndex(1)
    hs = chain(3)
    idx.insert(hs[:2], 0)
    with pytest.raises(ValueError, match="parent"):
        idx.insert([hs[2]], 0, parent=b"\x00" * 16)
    with pytest.raises(ValueError, match="chain"):
        idx.insert([hs[1]], 0)  # hs[1] lives under hs[0], not under the root
    assert idx.insert([hs[2]], 0, parent=hs[1]) == 1


def test_eviction_takes_lru_leaves_and_skips_pins() -> None:
    idx = PrefixIndex(1)
    a, b = chain(3, 0), chain(3, 1000)
    idx.insert(a, 0)
    idx.insert(b, 0)
    # a is older; its leaf goes first, never an inner node.
    assert idx.pick_victim(0) == a[2]
    idx.pin(a)
    assert idx.pick_victim(0) == b[2]
    idx.unpin(a)
    idx.match(a)  # a is now more recent than b
    assert idx.pick_victim(0) == b[2]
    with pytest.raises(ValueError, match="not pinned"):
        idx.unpin(a)


def test_remove_last_tier_drops_the_subtree() -> None:
    idx = PrefixIndex(2)
    hs = chain(4)
    idx.insert(hs[:2], 0)
    idx.insert(hs[2:], 1, parent=hs[1])
    dropped = idx.remove_tier(hs[1], 0)
    assert {d.key for d in dropped} == set(hs[1:])
    assert len(idx) == 1 and idx.match(hs).num_blocks == 1


def test_ttl_classes_and_expiry_with_fake_clock() -> None:
    clock = FakeClock()
    idx = PrefixIndex(1, RetentionPolicy(), clock)
    chat, agent = chain(2, 0), chain(2, 500)
    idx.insert(chat, 0, "chat")
    idx.insert(agent, 0, "agent")
    clock.advance(3 * DAY + 1)
    assert idx.match(agent).num_blocks == 0  # expired entries are misses before gc
    assert idx.match(chat).num_blocks == 2
    assert {d.key for d in idx.expire()} == set(agent)
    clock.advance(4 * DAY)
    idx.pin(chat[:1])  # pinned is never expired... but pin only takes unexpired blocks
    assert idx.pins_of(chat[0]) == 0
    assert {d.key for d in idx.expire()} == set(chat)
    assert len(idx) == 0


def test_refresh_extends_ttl_and_reports_sparsely() -> None:
    clock = FakeClock()
    idx = PrefixIndex(1, RetentionPolicy(), clock, persist_granularity=3600)
    hs = chain(2)
    idx.insert(hs, 0, "agent")
    clock.advance(60)
    assert idx.refresh(hs, "agent") == []
    clock.advance(3600)
    assert idx.refresh(hs, "agent") == hs
    clock.advance(10)
    idx.refresh(hs, "chat")  # a longer class wins
    assert idx.retention_of(hs[0]) == "chat"
    assert idx.expires_of(hs[0]) == pytest.approx(clock.now() + 7 * DAY)


def test_pinned_block_survives_expiry() -> None:
    clock = FakeClock()
    idx = PrefixIndex(1, RetentionPolicy({"x": 10.0}), clock)
    hs = chain(2)
    idx.insert(hs, 0, "x")
    idx.pin(hs)
    clock.advance(20)
    assert idx.expire() == []
    idx.unpin(hs)
    assert len(idx.expire()) == 2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_tiers"):
        PrefixIndex(0)
    idx = PrefixIndex(2)
    with pytest.raises(ValueError, match="tier"):
        idx.insert(chain(1), 2)
    with pytest.raises(ValueError, match="retention"):
        idx.insert(chain(1), 0, "weekly")
    with pytest.raises(ValueError, match="ttl"):
        RetentionPolicy({"chat": 0})
