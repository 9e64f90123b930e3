"""PagePool and the disk tier's reads into reused memory: a page's buffer is reused only after
every view of it is gone (never while the caller holds it), and reused pages never leak old
bytes (a corrupt block is still a miss)."""

from __future__ import annotations

import itertools
import threading

import hypothesis.strategies as st
import pytest
import torch
from _segment_tier_helpers import PAGE, fill, key, open_tier, page_of
from hypothesis import HealthCheck, given, settings

from deepinfer_cache import TieredKVStore
from deepinfer_cache.page_pool import PagePool, huge_page_slab
from deepinfer_cache.segment_format import RECORD_HEADER_BYTES


def test_pool_reuses_a_buffer_only_after_its_last_view_is_gone() -> None:
    pool = PagePool(4096, 1 << 20)
    (page,) = pool.take(1)
    ptr = page.data_ptr()
    half = page.view(torch.float16).reshape(2, 1024)[1]  # a view of part of the page
    arr = half.numpy()  # and a numpy array over it
    del page, half
    assert pool.stats.returned == 0 and pool.idle_bytes() == 0
    assert all(p.data_ptr() != ptr for p in pool.take(4))  # still held through ``arr``
    arr[:] = 7
    del arr
    assert pool.stats.returned >= 1
    again = pool.take(8)
    assert ptr in {p.data_ptr() for p in again}
    assert pool.stats.reused >= 1 and pool.stats.lent == 13


def test_pool_keeps_at_most_max_bytes_idle() -> None:
    pool = PagePool(4096, 2 * 4096)
    pages = pool.take(5)
    del pages
    assert pool.idle_bytes() == 2 * 4096
    assert pool.stats.returned == 5 and pool.stats.freed == 3
    pool.clear()
    assert pool.idle_bytes() == 0
    none = PagePool(4096, 0)  # no pooling: every buffer is freed when released
    del none.take(2)[0]
    assert none.idle_bytes() == 0


def test_a_page_freed_while_the_pool_is_locked_does_not_deadlock() -> None:
    # What a garbage collection inside ``take`` does: the finalizer runs in the thread that
    # holds the pool's lock.
    pool = PagePool(4096, 1 << 20)
    pages = pool.take(2)

    def free_under_lock() -> None:
        with pool._lock:
            pages.clear()

    t = threading.Thread(target=free_under_lock, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "giving a page back under the pool's lock deadlocked"
    assert pool.stats.returned == 2 and pool.idle_bytes() == 2 * 4096


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"page_bytes": 0, "max_bytes": 1}, "page_bytes"),
        ({"page_bytes": -1, "max_bytes": 1}, "page_bytes"),
        ({"page_bytes": 8, "max_bytes": -1}, "max_bytes"),
        ({"page_bytes": 8, "max_bytes": True}, "max_bytes"),
        ({"page_bytes": 8, "max_bytes": 1, "huge_pages": 1}, "huge_pages"),
    ],
)
def test_pool_refuses_bad_sizes(kw, name) -> None:
    with pytest.raises(ValueError, match=name):
        PagePool(**kw)


@pytest.mark.parametrize("huge", [True, False])
def test_new_pages_of_a_take_share_one_huge_page_slab(huge) -> None:
    page = 1 << 20
    pool = PagePool(page, 8 * page, huge_pages=huge)
    pages = pool.take(4)  # 4 MiB: a slab when huge pages are on
    ptrs = [p.data_ptr() for p in pages]
    if huge:  # one 2 MiB-aligned slab, the pages back to back
        assert ptrs[0] % (2 << 20) == 0
        assert all(b - a == page for a, b in itertools.pairwise(ptrs))
    for j, p in enumerate(pages):  # no page overlaps another
        p.fill_(j)
    assert all(int(p.min()) == int(p.max()) == j for j, p in enumerate(pages))
    del p, pages
    assert pool.stats.returned == 4 and pool.idle_bytes() == 4 * page
    again = pool.take(5)  # the 4 idle buffers first, then one new one (under 2 MiB: no slab)
    assert {p.data_ptr() for p in again[:4]} == set(ptrs) and pool.stats.reused == 4
    small = PagePool(4096, 1 << 20, huge_pages=huge).take(3)  # 12 KiB: never a slab
    assert len({p.data_ptr() for p in small}) == 3


def test_huge_page_slab_is_aligned_and_refuses_bad_sizes() -> None:
    slab = huge_page_slab(3 << 20)
    assert slab.nbytes == 3 << 20 and slab.ctypes.data % (2 << 20) == 0
    slab[:] = 7  # writable, all of it
    assert int(slab.sum()) == 7 * (3 << 20)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="nbytes"):
            huge_page_slab(bad)  # type: ignore[arg-type]


def test_tier_refuses_a_bad_pool_size(tmp_path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        open_tier(tmp_path / "c", read_pool_bytes=-1)


def test_held_pages_are_never_overwritten_by_later_reads(tmp_path) -> None:
    tier = open_tier(tmp_path / "c")
    fill(tier, range(16))
    held = tier.get_many([key(i) for i in range(8)])
    view = held[3][1]  # the caller keeps only a view of one page
    held_ptrs = {p.data_ptr() for p in held if p is not None}
    del held[3]
    for _ in range(20):  # later reads reuse whatever the pool holds idle
        for i, p in zip(range(8, 16), tier.get_many([key(i) for i in range(8, 16)])):
            assert p is not None and torch.equal(p, page_of(i))
            assert p.data_ptr() not in held_ptrs
    assert tier.page_pool.stats.reused > 0
    for j, p in enumerate(held):
        i = j if j < 3 else j + 1
        assert torch.equal(p, page_of(i)), f"held page {i} was overwritten"
    assert torch.equal(view, page_of(3)[1])
    tier.close()


def test_a_reused_buffer_never_serves_old_bytes_for_a_corrupt_block(tmp_path) -> None:
    tier = open_tier(tmp_path / "c", read_pool_bytes=1 << 20)
    fill(tier, range(4))
    for _ in range(3):  # the pool now holds buffers that held block 0's bytes
        assert torch.equal(tier.get_many([key(0)])[0], page_of(0))
    path, off = tier.location_of(key(1))
    with open(path, "r+b") as f:
        f.seek(off + RECORD_HEADER_BYTES + 5)
        b = f.read(1)
        f.seek(off + RECORD_HEADER_BYTES + 5)
        f.write(bytes([b[0] ^ 0x5A]))
    got = tier.get_many([key(i) for i in range(4)])
    assert got[1] is None  # a miss, never a stale or damaged page
    assert all(torch.equal(got[i], page_of(i)) for i in (0, 2, 3))
    assert tier.page_pool.stats.reused > 0
    tier.close()


def test_concurrent_readers_holding_pages_see_only_their_blocks(tmp_path) -> None:
    tier = open_tier(tmp_path / "c", read_pool_bytes=16 * 48)
    fill(tier, range(24))
    errors: list[str] = []

    def reader(lo: int) -> None:
        kept: list[tuple[int, torch.Tensor]] = []
        for r in range(30):
            ids = [lo + (r + j) % 12 for j in range(5)]
            for i, p in zip(ids, tier.get_many([key(i) for i in ids])):
                if p is None or not torch.equal(p, page_of(i)):
                    errors.append(f"block {i} read wrong")
                elif r % 3 == 0:
                    kept.append((i, p))
            if len(kept) > 6:
                kept.pop(0)
            for i, p in kept:
                if not torch.equal(p, page_of(i)):
                    errors.append(f"held block {i} overwritten")

    threads = [threading.Thread(target=reader, args=(lo,)) for lo in (0, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:5]
    tier.close()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["read", "drop"]), st.lists(st.integers(0, 11), max_size=6)),
        min_size=1,
        max_size=12,
    )
)
def test_random_reads_and_drops_never_change_a_held_page(tmp_path_factory, ops) -> None:
    tier = open_tier(tmp_path_factory.mktemp("pool"), read_pool_bytes=4 * 48)
    fill(tier, range(12))
    held: list[tuple[int, torch.Tensor]] = []
    for op, ids in ops:
        if op == "read":
            for i, p in zip(ids, tier.get_many([key(i) for i in ids])):
                assert p is not None and torch.equal(p, page_of(i))
                held.append((i, p))
        else:
            for _ in ids:
                if held:
                    held.pop(len(ids) % len(held))
        for i, p in held:
            assert torch.equal(p, page_of(i)), f"held block {i} changed"
    tier.close()


def test_fetched_pages_held_by_the_caller_survive_later_fetches(tmp_path) -> None:
    disk = open_tier(tmp_path / "c", read_pool_bytes=8 * 48)
    with TieredKVStore([disk], block_size=4) as store:
        prompts = [list(range(100 * p, 100 * p + 16)) for p in range(6)]  # 4 blocks each
        kvs = [torch.randn(4, *PAGE).to(torch.bfloat16) for _ in prompts]
        for t, kv in zip(prompts, kvs):
            store.store(t, kv)
        assert store.flush()
        held = store.fetch(prompts[0], promote=False, device="cpu").result()
        assert held.num_blocks == 4
        for _ in range(5):  # later fetches recycle the pool's buffers
            for t, kv in zip(prompts[1:], kvs[1:]):
                got = store.fetch(t, promote=False, device="cpu").result()
                assert all(torch.equal(p, kv[i]) for i, p in enumerate(got.pages))
        assert all(torch.equal(p, kvs[0][i]) for i, p in enumerate(held.pages))
        assert disk.page_pool.stats.reused > 0
