"""Block-key schemes (#20 item 8): the XXH3-128 default, the BLAKE2b option, lazy hashing."""

from __future__ import annotations

import json
import struct
import warnings

import numpy as np
import pytest
import torch
import xxhash
from _cache_helpers import BS, make_store, page_for, pages_for
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_cache.hashing as hashing_mod
import deepinfer_cache.store_reads as store_mod
from deepinfer_cache import (
    DEFAULT_KEY_HASH,
    KEY_HASHES,
    TieredKVStore,
    hash_token_blocks,
    iter_block_hashes,
)
from deepinfer_cache.hashing import namespace_root
from deepinfer_cache.key_scheme import RECORD


def lp(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def test_xxh3_scheme_follows_the_documented_formula() -> None:
    assert DEFAULT_KEY_HASH == "xxh3_128" and set(KEY_HASHES) == {"xxh3_128", "blake2b"}
    root = xxhash.xxh3_128_digest(
        b"deepinfer-cache/v2:xxh3_128" + lp(b"ns") + lp(b"model-a") + lp(b"lora-3")
    )
    assert namespace_root(b"ns", model=b"model-a", extra=b"lora-3") == root
    b0 = xxhash.xxh3_128_digest(root + struct.pack("<4i", 0, 1, 2, 3))
    b1 = xxhash.xxh3_128_digest(b0 + struct.pack("<4i", 4, 5, 6, 7) + b"img-hash")
    got = hash_token_blocks(
        list(range(10)), 4, b"ns", model=b"model-a", extra=b"lora-3", block_extras={1: b"img-hash"}
    )
    assert got == [b0, b1]
    # No model and no extra: the same formula with empty fields (one root shape for v2).
    plain = xxhash.xxh3_128_digest(b"deepinfer-cache/v2:xxh3_128" + lp(b"") + lp(b"") + lp(b""))
    assert namespace_root() == plain


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 2**31 - 1), min_size=0, max_size=60),
    st.sampled_from([1, 3, 4, 16]),
    st.sampled_from([b"", b"tenant-a"]),
)
def test_schemes_never_share_a_key_and_inputs_agree(tokens, bs, ns) -> None:
    fast = hash_token_blocks(tokens, bs, ns)
    slow = hash_token_blocks(tokens, bs, ns, key_hash="blake2b")
    assert len(fast) == len(slow) == len(tokens) // bs
    assert not set(fast) & set(slow)  # a cache of one scheme is all misses under the other
    for key_hash, want in (("xxh3_128", fast), ("blake2b", slow)):
        arr = np.asarray(tokens, dtype=np.int64)
        assert hash_token_blocks(arr, bs, ns, key_hash=key_hash) == want
        assert (
            hash_token_blocks(torch.tensor(tokens, dtype=torch.int64), bs, ns, key_hash=key_hash)
            == want
        )
        assert list(iter_block_hashes(tokens, bs, ns, key_hash=key_hash)) == want
        assert list(iter_block_hashes(arr.astype(np.int32), bs, ns, key_hash=key_hash)) == want


def test_bad_key_hash_is_refused_by_name(tmp_path) -> None:
    for call in (
        lambda: hash_token_blocks([1, 2], 2, key_hash="sha1"),
        lambda: iter_block_hashes([1, 2], 2, key_hash="md5"),
        lambda: namespace_root(key_hash="XXH3_128"),
        lambda: make_store(tmp_path, disk_pages=None, key_hash="builtin"),
    ):
        with pytest.raises(ValueError, match="key_hash"):
            call()


@pytest.mark.parametrize("as_array", [False, True])
def test_first_block_miss_hashes_only_that_block(tmp_path, as_array: bool) -> None:
    """Tokens past the first block are never converted: ids that would be refused there do
    not matter when block 0 misses (lists and arrays alike)."""
    store = make_store(tmp_path, disk_pages=None)
    first = [9, 9, 9, 9]
    bad_rest = [5] * (BS * 3) + [-1] * BS
    tokens: object = np.array(first + bad_rest) if as_array else first + bad_rest
    res = store.lookup(tokens)
    assert res.num_blocks == 0 and len(res.hashes) == 1
    assert res.hashes == hash_token_blocks(first, BS, key_hash=store.key_hash)
    with pytest.raises(ValueError, match=r"2\*\*31"):
        store.store(tokens, pages_for(first + [5] * (BS * 4)))  # store checks every id
    store.close()


@pytest.mark.parametrize(
    "bad, err",
    [
        ([1, 2, -3, 4], ValueError),
        ([1, 2, 2**31, 4], ValueError),
        ([1, 2.0, 3, 4], TypeError),
        ([1, True, 3, 4], TypeError),
        ([1, "2", 3, 4], TypeError),
    ],
)
def test_list_conversion_refuses_bad_ids(bad: list, err: type) -> None:
    with pytest.raises(err, match="tokens"):
        hash_token_blocks(bad, 4)
    with pytest.raises(err, match="tokens"):
        list(iter_block_hashes(bad, 4, key_hash="blake2b"))


def test_store_key_scheme_restart_rules(tmp_path) -> None:
    """A directory written under BLAKE2b (the keys of earlier releases) is all misses under the
    XXH3 default, never a wrong hit, and hits again when reopened with key_hash='blake2b'."""
    tokens = list(range(100, 100 + 4 * BS))
    old = make_store(tmp_path, device_pages=0, host_pages=0, key_hash="blake2b")
    assert old.store(tokens, pages_for_scheme(tokens, "blake2b")) == 4
    old.close()

    with pytest.warns(RuntimeWarning, match="key_hash='blake2b'"):
        new = make_store(tmp_path, device_pages=0, host_pages=0)
    assert new.key_hash == "xxh3_128"
    assert new.lookup(tokens).num_blocks == 0
    assert new.fetch(tokens).result().num_blocks == 0
    new.close()

    with pytest.warns(RuntimeWarning, match="key_hash='xxh3_128'"):  # it wrote there too
        again = make_store(tmp_path, device_pages=0, host_pages=0, key_hash="blake2b")
    assert again.lookup(tokens).num_blocks == 4
    got = again.fetch(tokens).result()
    assert got.num_blocks == 4
    assert torch.equal(got.stacked(), pages_for_scheme(tokens, "blake2b"))
    again.close()


def test_tenants_stay_separate_under_both_schemes(tmp_path) -> None:
    tokens = list(range(4 * BS))
    for key_hash in KEY_HASHES:
        store = make_store(tmp_path / key_hash, disk_pages=None, host_pages=16, key_hash=key_hash)
        assert isinstance(store, TieredKVStore)
        store.store(tokens, pages_for_scheme(tokens, key_hash, b"alice"), namespace=b"alice")
        assert store.lookup(tokens, b"alice").num_blocks == 4
        assert store.lookup(tokens, b"bob").num_blocks == 0
        assert store.lookup(tokens).num_blocks == 0
        store.close()


def pages_for_scheme(tokens: list[int], key_hash: str, ns: bytes = b"") -> torch.Tensor:
    """``pages_for`` with the hashes of ``key_hash`` (a page is a function of its hash)."""
    return torch.stack([page_for(h) for h in hash_token_blocks(tokens, BS, ns, key_hash=key_hash)])


@pytest.mark.parametrize("segments", [False, True])
def test_directory_records_its_key_schemes(tmp_path, segments: bool) -> None:
    """``key_schemes.json`` names every scheme that wrote the directory; a directory with blocks
    and no record (written before the record existed) counts as BLAKE2b; a damaged record is
    rewritten, never fatal."""
    tokens = list(range(3 * BS))
    first = make_store(tmp_path, device_pages=0, host_pages=0, segments=segments)
    first.store(tokens, pages_for(tokens))
    first.close()
    record = tmp_path / RECORD
    assert json.loads(record.read_text()) == {"key_hashes": ["xxh3_128"], "last": "xxh3_128"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same scheme again: no warning
        make_store(tmp_path, device_pages=0, host_pages=0, segments=segments).close()

    record.unlink()  # as a directory from before the record existed
    with pytest.warns(RuntimeWarning, match="key_hash='blake2b'"):
        legacy = make_store(tmp_path, device_pages=0, host_pages=0, segments=segments)
    assert legacy.lookup(tokens).num_blocks == 3  # these blocks are xxh3 keyed: still served
    legacy.close()
    assert json.loads(record.read_text()) == {
        "key_hashes": ["blake2b", "xxh3_128"],
        "last": "xxh3_128",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once after the change, not on every start
        make_store(tmp_path, device_pages=0, host_pages=0, segments=segments).close()

    record.write_bytes(b"\x00not json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        damaged = make_store(tmp_path, device_pages=0, host_pages=0, segments=segments)
    assert damaged.lookup(tokens).num_blocks == 3
    damaged.close()
    assert json.loads(record.read_text()) == {"key_hashes": ["xxh3_128"], "last": "xxh3_128"}


@pytest.mark.parametrize("native", [True, False], ids=["c-chain", "python"])
@pytest.mark.parametrize("k", [1, 2, 3, 6, 7, 20])
def test_a_miss_on_block_k_hashes_few_blocks(monkeypatch, k: int, native: bool) -> None:
    """At most 2 k + 1 blocks in Python (chunks double), 8 k + 1 with the C chain (chunks grow
    8x: a block costs ~30 ns there against ~10 us a call)."""
    if native and hashing_mod.chain_hasher() is None:
        pytest.skip("no C chain here")
    if not native:
        monkeypatch.setattr(hashing_mod, "chain_hasher", lambda: None)
    calls: list[bytes] = []
    real = store_mod.hash_chunks

    def counting(*a, **kw):
        for chunk in real(*a, **kw):
            calls.extend(chunk)
            yield chunk

    monkeypatch.setattr(store_mod, "hash_chunks", counting)
    store = make_store(None, device_pages=0, host_pages=64, disk_pages=None)
    tokens = list(range(64 * BS))
    store.store(tokens[: k * BS], pages_for(tokens[: k * BS]))
    calls.clear()
    res = store.lookup(tokens)
    assert res.num_blocks == k and len(res.hashes) == k + 1
    assert k + 1 <= len(calls) <= (8 if native else 2) * k + 1
    store.close()
