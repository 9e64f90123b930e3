"""Random store/fetch/gc sequences on tiny tiers: the index and the tiers always agree, and
everything served is exactly what was stored."""

from __future__ import annotations

import tempfile

import hypothesis.strategies as st
from _cache_helpers import BS, make_store, page_for, pages_for
from hypothesis import given, settings

from deepinfer_cache import FakeClock, hash_token_blocks

# Prompts share prefixes: a few stems, each with a few continuations.
PROMPTS = [
    [s * 100 + i for i in range(BS * 2)] + [9000 + s * 10 + c + k for k in range(BS * (c + 1))]
    for s in range(3)
    for c in range(3)
]

ops = st.lists(
    st.tuples(
        st.sampled_from(["store", "fetch", "lookup", "gc"]), st.integers(0, len(PROMPTS) - 1)
    ),
    min_size=1,
    max_size=25,
)


def check_consistent(store) -> None:
    idx = store.index
    for i, tier in enumerate(store.tiers):
        in_index = set(idx.keys_in(i))
        assert in_index == set(tier.keys()), f"tier {tier.name} disagrees with the index"
    for key in idx.keys_parents_first():
        parent = idx.parent_of(key)
        assert parent is None or parent in idx


@settings(max_examples=30, deadline=None)
@given(
    ops,
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(1, 6),
    st.sampled_from(["write-back", "write-through"]),
)
def test_random_ops_keep_tiers_and_index_consistent(
    seq: list[tuple[str, int]], dev: int, host: int, disk: int, policy: str
) -> None:
    clock = FakeClock()
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(
            tmp,
            device_pages=dev,
            host_pages=host,
            disk_pages=disk,
            write_policy=policy,
            clock=clock,
        )
        for op, p in seq:
            tokens = PROMPTS[p]
            if op == "store":
                store.store(tokens, pages_for(tokens), retention="agent" if p % 2 else "chat")
            elif op == "fetch":
                res = store.fetch(tokens).result()
                hs = hash_token_blocks(tokens, BS)
                for h, page in zip(hs, res.pages):
                    assert page.equal(page_for(h))
            elif op == "lookup":
                assert store.lookup(tokens).num_tokens <= len(tokens)
            else:
                clock.advance(2 * 86400)
                store.gc()
            store.flush()
            check_consistent(store)
        store.close()
