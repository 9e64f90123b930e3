"""The PrefixIndex against a plain-dict model: insert, match, pin, unpin, evict, expire."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from deepinfer_cache import FakeClock, PrefixIndex, RetentionPolicy

TIERS = 3
TTLS = {"chat": 100.0, "agent": 30.0}


class _M:
    def __init__(self, parent: bytes | None, expires: float, retention: str) -> None:
        self.parent = parent
        self.tiers: set[int] = set()
        self.pins = 0
        self.expires = expires
        self.retention = retention


class IndexMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.clock = FakeClock(1000.0)
        self.idx = PrefixIndex(TIERS, RetentionPolicy(TTLS), self.clock)
        self.m: dict[bytes, _M] = {}
        self.stamp: list[dict[bytes, int]] = [{} for _ in range(TIERS)]
        self.tick = 0
        self.next_key = 0
        self.pinned: list[list[bytes]] = []

    # ------------------------------------------------------------- model helpers
    def _new_key(self) -> bytes:
        self.next_key += 1
        return self.next_key.to_bytes(16, "little")

    def _path(self, key: bytes | None) -> list[bytes]:
        out: list[bytes] = []
        while key is not None:
            out.append(key)
            key = self.m[key].parent
        return out[::-1]

    def _touch(self, path: list[bytes]) -> None:
        for k in reversed(path):
            for t in sorted(self.m[k].tiers):
                self.tick += 1
                self.stamp[t][k] = self.tick

    def _add_tier(self, k: bytes, t: int) -> None:
        if t not in self.m[k].tiers:
            self.m[k].tiers.add(t)
            self.tick += 1
            self.stamp[t][k] = self.tick

    def _drop(self, k: bytes) -> None:
        stack = [k]
        while stack:
            n = stack.pop()
            stack.extend(c for c, v in self.m.items() if v.parent == n)
            for t in self.m[n].tiers:
                del self.stamp[t][n]
            del self.m[n]

    def _choose(self, data: st.DataObject) -> bytes | None:
        keys = sorted(self.m)
        if not keys:
            return None
        return data.draw(st.sampled_from([None, *keys]))

    def _refresh(self, k: bytes, expires: float, retention: str) -> None:
        if expires > self.m[k].expires:
            self.m[k].expires = expires
            self.m[k].retention = retention

    # ------------------------------------------------------------- rules
    @rule(
        data=st.data(),
        n=st.integers(1, 3),
        tier=st.integers(0, TIERS - 1),
        retention=st.sampled_from(sorted(TTLS)),
    )
    def insert_new(self, data: st.DataObject, n: int, tier: int, retention: str) -> None:
        parent = self._choose(data)
        keys = [self._new_key() for _ in range(n)]
        created = self.idx.insert(keys, tier, retention, parent=parent)
        assert created == n
        expires = self.clock.now() + TTLS[retention]
        prev = parent
        for k in keys:
            self.m[k] = _M(prev, expires, retention)
            self._add_tier(k, tier)
            prev = k
        for a in self._path(parent):
            self._refresh(a, expires, retention)
        self._touch(self._path(keys[-1]))

    @precondition(lambda self: bool(self.m))
    @rule(data=st.data(), tier=st.integers(0, TIERS - 1), retention=st.sampled_from(sorted(TTLS)))
    def insert_existing(self, data: st.DataObject, tier: int, retention: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.m)))
        path = self._path(key)
        assert self.idx.insert(path, tier, retention) == 0
        expires = self.clock.now() + TTLS[retention]
        for k in path:
            self._refresh(k, expires, retention)
            self._add_tier(k, tier)
        self._touch(path)

    @rule(data=st.data(), extra=st.booleans())
    def match(self, data: st.DataObject, extra: bool) -> None:
        key = self._choose(data)
        query = self._path(key) + ([self._new_key()] if extra else [])
        now = self.clock.now()
        n = 0
        for k in query:
            if k not in self.m or self.m[k].expires <= now:
                break
            n += 1
        res = self.idx.match(query)
        assert res.num_blocks == n
        assert list(res.tiers) == [sum(1 << t for t in self.m[k].tiers) for k in query[:n]]
        self._touch(query[:n])

    @precondition(lambda self: bool(self.m))
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.m)))
        path = self._path(key)
        now = self.clock.now()
        n = 0
        for k in path:
            if self.m[k].expires <= now:
                break
            n += 1
        assert self.idx.pin(path) == n
        for k in path[:n]:
            self.m[k].pins += 1
        self.pinned.append(path[:n])

    @precondition(lambda self: bool(self.pinned))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.pinned) - 1))
        path = self.pinned.pop(i)
        self.idx.unpin(path)
        for k in path:
            self.m[k].pins -= 1

    @rule(tier=st.integers(0, TIERS - 1), strict=st.booleans())
    def evict(self, tier: int, strict: bool) -> None:
        eligible = [
            k
            for k, v in self.m.items()
            if tier in v.tiers
            and v.pins == 0
            and not any(c.parent == k and tier in c.tiers for c in self.m.values())
            and (not strict or len(v.tiers) > 1 or not any(c.parent == k for c in self.m.values()))
        ]
        victim = self.idx.pick_victim(tier, keep_inner_last_copies=strict)
        if not eligible:
            assert victim is None
            return
        assert victim == min(eligible, key=lambda k: self.stamp[tier][k])
        dropped = self.idx.remove_tier(victim, tier)
        self.m[victim].tiers.discard(tier)
        del self.stamp[tier][victim]
        if not self.m[victim].tiers:
            if strict:
                assert not any(c.parent == victim for c in self.m.values())
            before = set(self.m)
            self._drop(victim)
            assert {d.key for d in dropped} == before - set(self.m)
        else:
            assert dropped == []

    @rule(seconds=st.floats(0, 60))
    def expire(self, seconds: float) -> None:
        self.clock.advance(seconds)
        now = self.clock.now()
        before = set(self.m)
        for k in [k for k, v in self.m.items() if v.expires <= now and v.pins == 0]:
            if k in self.m:
                self._drop(k)
        dropped = self.idx.expire()
        assert {d.key for d in dropped} == before - set(self.m)

    @invariant()
    def agrees(self) -> None:
        assert len(self.idx) == len(self.m)
        for k, v in self.m.items():
            assert self.idx.tiers_of(k) == sum(1 << t for t in v.tiers)
            assert self.idx.pins_of(k) == v.pins
            assert self.idx.expires_of(k) == v.expires
        for t in range(TIERS):
            assert self.idx.keys_in(t) == sorted(self.stamp[t], key=self.stamp[t].__getitem__)


IndexMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestIndexMachine = IndexMachine.TestCase
