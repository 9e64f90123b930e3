"""The small ones of #20 item 10, one test each."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from _cache_helpers import BS, PAGE, PAGE_BYTES, make_store, pages_for

from deepinfer_cache import DeviceTier, DiskTier, HostTier, TieredKVStore, hash_token_blocks


def toks(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def test_scrub_removes_payload_corrupt_blocks_before_lookup_counts_them(tmp_path) -> None:
    t = toks(3)
    store = make_store(tmp_path, device_pages=0, host_pages=0)
    store.store(t, pages_for(t))
    store.close()
    disk = DiskTier(tmp_path, PAGE, torch.float32, 1 << 20, fsync=False)
    path = disk.path_of(hash_token_blocks(t, BS)[1])
    with open(path, "r+b") as f:  # flip a payload byte: the header stays valid
        f.seek(-3, os.SEEK_END)
        b = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))
    store = TieredKVStore([disk], BS)
    assert store.lookup(t).num_blocks == 3  # lookup reads no payload: an upper bound...
    assert store.scrub() == 1  # ...until a scrub (or a fetch) reads it
    assert store.lookup(t).num_blocks == 1
    assert store.stats().corrupt_quarantined == 1
    store.close()


def test_fetch_rejects_negative_max_blocks(tmp_path) -> None:
    store = make_store(tmp_path, disk_pages=None)
    t = toks(2)
    store.store(t, pages_for(t))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_blocks"):
            store.fetch(t, max_blocks=bad)  # type: ignore[arg-type]
    assert store.fetch(t, max_blocks=0).result().num_blocks == 0
    assert store.fetch(t, max_blocks=1).result().num_blocks == 1


def test_store_takes_a_list_of_pages_and_names_bad_ones(tmp_path) -> None:
    store = make_store(tmp_path, disk_pages=None, host_pages=4)
    t = toks(2)
    assert store.store(t, list(pages_for(t))) == 2
    assert store.fetch(t).result().stacked().equal(pages_for(t))
    with pytest.raises(TypeError, match="pages"):
        store.store(toks(2, 100), [1, 2])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="pages"):
        store.store(toks(2, 100), torch.zeros(2, 9))
    with pytest.raises(TypeError, match="dtype"):
        store.store(toks(2, 100), pages_for(toks(2, 100)).double())
    with pytest.raises(TypeError, match="pages"):
        store.store(toks(2, 100), "pages")  # type: ignore[arg-type]


def test_zero_sized_page_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="page_shape"):
        HostTier((0, 4), torch.float32, 1024)
    with pytest.raises(ValueError, match="page_shape"):
        DeviceTier.allocate((4, 0), torch.float32, 1024)
    with pytest.raises(ValueError, match="page_shape"):
        DeviceTier(torch.zeros(4, 0, 3))
    with pytest.raises(TypeError, match="page_shape"):
        HostTier((2, True), torch.float32, 1024)


def test_lookup_takes_iterators_like_store(tmp_path) -> None:
    store = make_store(tmp_path, disk_pages=None)
    t = toks(2)
    assert store.store(iter(t), pages_for(t)) == 2
    assert store.lookup(iter(t)).num_blocks == 2
    assert store.lookup(x for x in t).num_tokens == 2 * BS
    assert store.lookup(range(2 * BS)).num_blocks == 2
    assert store.fetch(iter(t)).result().num_blocks == 2
    assert store.stats().query_tokens == 2 * 2 * BS + 2 * BS


def test_closed_store_refuses_every_operation(tmp_path) -> None:
    store = make_store(tmp_path)
    t = toks(1)
    store.store(t, pages_for(t))
    store.close()
    store.close()  # idempotent
    assert store.closed
    for call in (
        lambda: store.lookup(t),
        lambda: store.gc(),
        lambda: store.fetch(t),
        lambda: store.store(t, pages_for(t)),
        lambda: store.scrub(),
        lambda: store.clear(),
        lambda: store.delete_namespace(b""),
    ):
        with pytest.raises(RuntimeError, match="closed"):
            call()


def test_booleans_are_not_token_ids() -> None:
    with pytest.raises(TypeError, match="bool"):
        hash_token_blocks([1, 2, True, 4], 2)
    with pytest.raises(TypeError, match="integers"):
        hash_token_blocks(np.array([True, False]), 1)
    with pytest.raises(TypeError, match="integers"):
        hash_token_blocks(torch.tensor([True, False]), 1)
    with pytest.raises(ValueError, match="2\\*\\*31"):
        hash_token_blocks([2**31], 1)
    with pytest.raises(ValueError):
        hash_token_blocks([-1], 1)
    store = TieredKVStore([HostTier(PAGE, torch.float32, 4 * PAGE_BYTES)], BS)
    with pytest.raises(TypeError, match="bool"):
        store.lookup([True] * BS)
