"""``PrefixIndex.match`` through the binary search and parent links (``index_walk.py``) equals
probing each block, for chains, lists that are not one chain, and expired blocks between."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from deepinfer_cache import FakeClock, PrefixIndex, RetentionPolicy

KEYS = [i.to_bytes(16, "big") for i in range(1, 40)]


def _reference(idx: PrefixIndex, hashes: list[bytes], now: float) -> tuple[int, tuple[int, ...]]:
    masks = []
    for h in hashes:
        i = idx._ids.get(h)
        if i is None or idx._expires[i] <= now:
            break
        masks.append(idx._tiers[i])
    return len(masks), tuple(masks)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_match_equals_probing_each_block(data) -> None:
    clock = FakeClock()
    idx = PrefixIndex(2, retention=RetentionPolicy({"chat": 100.0, "agent": 10.0}), clock=clock)
    # A few chains under shared prefixes: each is a path of distinct keys.
    chains: list[list[bytes]] = []
    pool = list(KEYS)
    for _ in range(data.draw(st.integers(1, 4))):
        base = data.draw(st.sampled_from(chains)) if chains else []
        cut = data.draw(st.integers(0, len(base)))
        n = data.draw(st.integers(1, 6))
        if len(pool) < n:
            break
        new, pool = pool[:n], pool[n:]
        chain = base[:cut] + new
        retention = data.draw(st.sampled_from(["chat", "agent"]))
        idx.insert(chain, tier=data.draw(st.integers(0, 1)), retention=retention)
        chains.append(chain)
        clock.advance(data.draw(st.sampled_from([0.0, 5.0])))
    clock.advance(data.draw(st.sampled_from([0.0, 6.0, 50.0])))  # some "agent" blocks expire
    kind = data.draw(st.sampled_from(["chain", "chain+tail", "any"]))
    if kind == "any":  # not one chain: keys from different chains, repeats, unknown keys
        probe = data.draw(st.lists(st.sampled_from(KEYS), max_size=10))
    else:
        probe = list(data.draw(st.sampled_from(chains)))
        if kind == "chain+tail":
            probe += data.draw(st.lists(st.sampled_from(KEYS), max_size=4))
    want = _reference(idx, probe, clock.now())
    got = idx.match(probe, touch=False)
    assert (got.num_blocks, got.tiers) == want
    assert idx.match(tuple(probe)).num_blocks == want[0]
    # The index still grows after the vectorised reads released their views of its columns.
    if pool:
        idx.insert([pool[0]], tier=0)
