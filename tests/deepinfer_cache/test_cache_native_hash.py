"""The C block-hash chain (``native_hash.py``, #20 item 8) against the pure-Python loop.

Keys must stay byte-identical (existing caches keep hitting), with or without a compiler.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import xxhash
from hypothesis import given, settings

from deepinfer_cache import (
    HostTier,
    TieredKVStore,
    hash_token_blocks,
    iter_block_hashes,
    native_hash,
    native_tokens,
)
from deepinfer_cache import hashing as hashing_mod
from deepinfer_cache.native_hash import (
    ChainHasher,
    NativeHashUnavailable,
    build_library,
    load_chain_hasher,
)


@pytest.fixture(scope="module")
def hasher(tmp_path_factory: pytest.TempPathFactory) -> ChainHasher:
    try:
        return load_chain_hasher(tmp_path_factory.mktemp("native"))
    except NativeHashUnavailable as exc:  # no compiler here: the Python loop is all there is
        pytest.skip(f"no native chain: {exc}")


def _python_chain(root: bytes, data: bytes, n: int, size: int) -> list[bytes]:
    out, parent = [], root
    for i in range(n):
        parent = xxhash.xxh3_128_digest(parent + data[i * size : (i + 1) * size])
        out.append(parent)
    return out


@settings(max_examples=40, deadline=None)
@given(
    root=st.binary(min_size=16, max_size=16),
    n=st.integers(0, 40),
    size=st.sampled_from([4, 8, 64, 256, 1024]),
    seed=st.integers(0, 2**32 - 1),
)
def test_chain_equals_the_python_loop(
    hasher: ChainHasher, root: bytes, n: int, size: int, seed: int
) -> None:
    data = np.random.default_rng(seed).integers(0, 256, n * size, dtype=np.uint8).tobytes()
    got = hasher(root, memoryview(data), n, size)
    assert got == _python_chain(root, data, n, size)
    assert all(type(h) is bytes and len(h) == 16 for h in got)


def test_digests_ending_in_zero_bytes_keep_them(hasher: ChainHasher) -> None:
    # 'S16' would strip trailing NULs; find blocks whose digest ends in one and check it stays.
    root = bytes(16)
    data = np.arange(4 * 3000, dtype="<u4").tobytes()  # 3000 one-token blocks
    got = hasher(root, memoryview(data), 3000, 4)
    assert got == _python_chain(root, data, 3000, 4)
    assert any(h.endswith(b"\x00") for h in got)


def test_rejects_bad_arguments(hasher: ChainHasher) -> None:
    with pytest.raises(ValueError, match="root"):
        hasher(b"short", memoryview(bytes(8)), 1, 8)
    with pytest.raises(ValueError, match="blocks holds"):
        hasher(bytes(16), memoryview(bytes(8)), 2, 8)
    assert hasher(bytes(16), memoryview(b""), 0, 8) == []


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), max_size=300),
    bs=st.sampled_from([1, 3, 16, 64]),
    ns=st.binary(max_size=8),
    model=st.binary(max_size=8),
    extra=st.binary(max_size=8),
    as_numpy=st.booleans(),
)
def test_store_keys_are_the_same_with_and_without_the_c_chain(
    hasher: ChainHasher,
    tokens: list[int],
    bs: int,
    ns: bytes,
    model: bytes,
    extra: bytes,
    as_numpy: bool,
) -> None:
    toks = np.array(tokens, dtype=np.int64) if as_numpy else tokens
    kw = {"model": model, "extra": extra}
    native = hash_token_blocks(toks, bs, ns, **kw)
    lazy = list(iter_block_hashes(toks, bs, ns, **kw))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hashing_mod, "chain_hasher", lambda: None)
        python = hash_token_blocks(toks, bs, ns, **kw)
        python_lazy = list(iter_block_hashes(toks, bs, ns, **kw))
    assert native == python == lazy == python_lazy


class _Counting:
    """Wraps the chain and records how many blocks each call hashed."""

    def __init__(self, inner: ChainHasher) -> None:
        self.inner = inner
        self.calls: list[int] = []

    def __call__(self, root: bytes, blocks: memoryview, n: int, size: int) -> list[bytes]:
        self.calls.append(n)
        return self.inner(root, blocks, n, size)


def test_first_block_miss_hashes_one_block(
    hasher: ChainHasher, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = TieredKVStore([HostTier((2,), torch.float32, 1 << 16)], block_size=4)
    store.store(list(range(40)), torch.zeros(10, 2))
    counting = _Counting(hasher)
    monkeypatch.setattr(hashing_mod, "chain_hasher", lambda: counting)
    assert store.lookup([7, *range(1, 4000)]).num_blocks == 0
    assert counting.calls == []  # one block: hashed in Python, cheaper than a C call
    assert store.lookup(list(range(40)) + [1] * 4000).num_blocks == 10
    # Chunks of 1, 8 (Python), 64 (C) blocks reach the 10th block and its miss at the 11th.
    assert counting.calls == [64]
    counting.calls.clear()
    assert store.lookup(list(range(40)) + [1] * 40_000).num_blocks == 10
    assert counting.calls == [64]  # the rest of the long prompt is never hashed


def test_no_compiler_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(NativeHashUnavailable, match="no C compiler"):
        build_library(tmp_path, cc="definitely-not-a-compiler-xyz")


def test_no_compiler_falls_back_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "definitely-not-a-compiler-xyz")
    monkeypatch.delenv("DEEPINFER_CACHE_NATIVE", raising=False)
    native_hash.chain_hasher.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="pure-Python"):
            assert native_hash.chain_hasher() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert native_hash.chain_hasher() is None  # cached: warned once
            # Keys are computed by the Python loop, the same as ever.
            monkeypatch.setattr(hashing_mod, "chain_hasher", native_hash.chain_hasher)
            got = hash_token_blocks(list(range(64)), 16)
        assert got == _python_chain(
            hashing_mod.namespace_root(),
            np.arange(64, dtype="<i4").tobytes(),
            4,
            64,
        )
    finally:
        native_hash.chain_hasher.cache_clear()


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPINFER_CACHE_NATIVE", "0")
    native_hash.chain_hasher.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert native_hash.chain_hasher() is None
    finally:
        native_hash.chain_hasher.cache_clear()


def test_a_cached_build_is_reused(hasher: ChainHasher, tmp_path: Path) -> None:
    first = build_library(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert build_library(tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".chain_hash-")]


class _Id(int):
    """An int subclass: not taken by the C loop, still accepted by the checked path."""


_ITEMS = st.one_of(
    st.integers(0, 2**31 - 1),
    st.integers(2**29, 2**31 + 5),
    st.integers(-3, 3),
    st.booleans(),
    st.builds(_Id, st.integers(0, 100)),
    st.just(2**64),
    st.just(1.0),
)


def _outcome(fn: Any, tokens: Any) -> Any:
    try:
        return bytes(fn(tokens))
    except (TypeError, ValueError) as exc:
        return type(exc)


@settings(max_examples=80, deadline=None)
@given(st.lists(_ITEMS, max_size=40), st.booleans())
def test_list_conversion_accepts_and_refuses_as_before(items: list[Any], as_tuple: bool) -> None:
    if native_tokens.list_converter() is None:
        pytest.skip("no C list conversion here")
    tokens = tuple(items) if as_tuple else items
    fast = _outcome(hashing_mod._list_to_int32_buffer, tokens)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hashing_mod, "list_converter", lambda: None)
        slow = _outcome(hashing_mod._list_to_int32_buffer, tokens)
    assert fast == slow
    convert = native_tokens.list_converter()
    assert convert is not None
    got = convert(tokens, 0, len(tokens))
    plain = all(type(v) is int and 0 <= v <= 2**31 - 1 for v in items)
    assert (got is not None) == plain
    if got is not None:
        assert got.tolist() == list(items)
    # A range is read in place, with the bounds clamped like a slice.
    lo, hi = len(items) // 3, len(items) - 1
    part = convert(tokens, lo, hi)
    plain = all(type(v) is int and 0 <= v <= 2**31 - 1 for v in items[lo:hi])
    assert (part is not None) == plain
    if part is not None:
        assert part.tolist() == list(items[lo:hi])
    assert convert(tokens, 5, 10**6) is None or convert(tokens, 5, 10**6).size == max(
        0, len(items) - 5
    )


def test_list_conversion_builds_without_python_fallback_when_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEEPINFER_CACHE_NATIVE", "0")
    native_tokens.list_converter.cache_clear()
    try:
        assert native_tokens.list_converter() is None
        assert bytes(hashing_mod._list_to_int32_buffer([1, 2])) == bytes(
            np.array([1, 2], dtype="<i4").data
        )
    finally:
        native_tokens.list_converter.cache_clear()


def test_list_conversion_without_a_compiler_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(NativeHashUnavailable, match="no C compiler"):
        native_tokens.load_list_converter(tmp_path, cc="definitely-not-a-compiler-xyz")
