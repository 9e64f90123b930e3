"""A nested eviction during demotion drops the victim with its ancestor (95fce9b), built
deterministically: three one-way-full memory tiers where placing the victim one tier down makes
that tier evict the victim's parent, which no tier below will take, so the parent leaves the
index with its subtree (the victim) and the victim's own placement there fails too. Before
95fce9b the demotion loop then tried the next tier and read the victim's metadata again:
``KeyError`` in ``PrefixIndex.parent_of`` (seen once in CI, timing-dependent)."""

from __future__ import annotations

import torch
from _cache_helpers import BS, PAGE, PAGE_BYTES, page_for

from deepinfer_cache import HostTier, TieredKVStore
from deepinfer_cache.meta import BlockMeta


class RefusingHost(HostTier):
    """A host tier that declines (``put`` -> False, as a tier out of room or refusing a copy
    does) the keys in ``refuse``: the test decides which placements fail, and when."""

    def __init__(self, pages: int) -> None:
        super().__init__(PAGE, torch.float32, pages * PAGE_BYTES, pin_memory=False)
        self.refuse: set[bytes] = set()

    def put(self, key: bytes, page: torch.Tensor, meta: BlockMeta | None) -> bool:
        if key in self.refuse:
            return False
        return super().put(key, page, meta)


def _pages(store: TieredKVStore, tokens: list[int]) -> torch.Tensor:
    return torch.stack([page_for(h) for h in store.hashes(tokens)])


def test_demotion_whose_placement_evicts_the_victims_parent_drops_both_and_goes_on() -> None:
    top = HostTier(PAGE, torch.float32, PAGE_BYTES, pin_memory=False)  # one page
    middle, bottom = RefusingHost(1), RefusingHost(4)
    store = TieredKVStore([top, middle, bottom], BS, fetch_threads=1, persist_on_close=False)
    try:
        chain = list(range(2 * BS))  # blocks A (parent), V (the victim to be)
        other, last = list(range(100, 100 + BS)), list(range(200, 200 + BS))
        a, v = store.hashes(chain)
        (x,) = store.hashes(other)

        # A in top; X pushes A down to middle; V (child of A) pushes X past the full middle
        # (A is protected as V's stored prefix) to the bottom and lands in top.
        assert store.store(chain[:BS], _pages(store, chain[:BS])) == 1
        assert store.store(other, _pages(store, other)) == 1
        assert store.store(chain, _pages(store, chain)) == 1
        assert (a in middle, v in top, x in bottom) == (True, True, True)
        assert (a not in top, v not in middle, len(top), len(middle)) == (True, True, 1, 1)

        # Storing one more block evicts V from top. Its demotion into the full middle
        # evicts A there; the bottom declines A, so A leaves the index with V. Then the
        # middle declines V itself: the loop must stop, not read V's metadata for the bottom.
        middle.refuse.add(v)
        bottom.refuse.add(a)
        assert store.store(last, _pages(store, last)) == 1

        assert store.lookup(chain).num_blocks == 0  # A and V dropped together
        assert set(store.block_hashes()) == {x, *store.hashes(last)}
        assert (len(top), len(middle), len(bottom)) == (1, 0, 1)  # no copy left behind
        stats = store.stats()
        assert [t.evictions for t in stats.tiers] == [3, 1, 0]
        for tokens in (other, last):  # the survivors still serve their own bytes
            got = store.fetch(tokens, promote=False).result(timeout=30)
            assert got.num_blocks == 1
            assert torch.equal(got.pages[0], page_for(store.hashes(tokens)[0]))
    finally:
        store.close()
