"""Block keys carry the model identity and optional extra key material (#20 item 5)."""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch
from _cache_helpers import BS, PAGE, pages_for
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_cache import DiskTier, HostTier, TieredKVStore, hash_token_blocks, iter_block_hashes
from deepinfer_cache.hashing import namespace_root


def lp(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def test_keyed_root_and_block_extras_follow_the_documented_formula() -> None:
    toks = list(range(8))
    root = hashlib.blake2b(
        b"deepinfer-cache/v1+k" + lp(b"ns") + lp(b"model-a") + lp(b"lora-3"), digest_size=16
    ).digest()
    assert namespace_root(b"ns", model=b"model-a", extra=b"lora-3", key_hash="blake2b") == root
    b0 = hashlib.blake2b(struct.pack("<4i", 0, 1, 2, 3), digest_size=16, key=root).digest()
    b1 = hashlib.blake2b(
        struct.pack("<4i", 4, 5, 6, 7) + b"img-hash", digest_size=16, key=b0
    ).digest()
    got = hash_token_blocks(
        toks,
        4,
        b"ns",
        model=b"model-a",
        extra=b"lora-3",
        block_extras={1: b"img-hash"},
        key_hash="blake2b",
    )
    assert got == [b0, b1]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 2**31 - 1), min_size=8, max_size=40),
    st.sampled_from([b"", b"m1", b"m2"]),
    st.sampled_from([b"", b"x"]),
)
def test_model_and_extra_separate_every_block(tokens, model, extra) -> None:
    base = hash_token_blocks(tokens, 4)
    keyed = hash_token_blocks(tokens, 4, model=model, extra=extra)
    if model or extra:
        assert not set(base) & set(keyed)
    else:
        assert base == keyed
    assert list(iter_block_hashes(tokens, 4, model=model, extra=extra)) == keyed


def test_block_extra_changes_that_block_and_everything_after() -> None:
    toks = list(range(16))
    plain = hash_token_blocks(toks, 4)
    img = hash_token_blocks(toks, 4, block_extras={2: b"sha256-of-image"})
    assert img[:2] == plain[:2] and all(a != b for a, b in zip(img[2:], plain[2:]))
    with pytest.raises(ValueError, match="block_extras"):
        hash_token_blocks(toks, 4, block_extras={-1: b"x"})
    with pytest.raises(TypeError, match="model"):
        hash_token_blocks(toks, 4, model="llama")  # type: ignore[arg-type]


def test_two_models_on_one_directory_never_share_kv(tmp_path) -> None:
    tokens = list(range(3 * BS))

    def disk_store(model: bytes) -> TieredKVStore:
        return TieredKVStore(
            [DiskTier(tmp_path, PAGE, torch.float32, 1 << 20, fsync=False)], BS, model=model
        )

    with disk_store(b"model-a") as a:
        assert a.store(tokens, pages_for(tokens)) == 3
    with disk_store(b"model-b") as b:  # same layout, explicit shared directory
        assert b.lookup(tokens).num_blocks == 0
    with disk_store(b"model-a") as a:
        assert a.lookup(tokens).num_blocks == 3


def test_extra_keys_and_tenants_through_the_store() -> None:
    store = TieredKVStore([HostTier(PAGE, torch.float32, 1 << 20)], BS, model=b"m")
    tokens = list(range(2 * BS))
    store.store(tokens, pages_for(tokens), namespace=b"alice", extra=b"lora-1")
    assert store.lookup(tokens, b"alice", extra=b"lora-1").num_blocks == 2
    assert store.lookup(tokens, b"alice").num_blocks == 0  # no adapter: other KV
    assert store.lookup(tokens, b"alice", extra=b"lora-2").num_blocks == 0
    assert store.lookup(tokens, b"bob", extra=b"lora-1").num_blocks == 0
    res = store.fetch(tokens, b"alice", extra=b"lora-1").result()
    assert res.num_blocks == 2
    store.store(tokens, pages_for(tokens), namespace=b"alice", block_extras={1: b"img"})
    assert store.lookup(tokens, b"alice", block_extras={1: b"img"}).num_blocks == 2
    assert store.lookup(tokens, b"alice", block_extras={1: b"other"}).num_blocks == 1
    store.close()
