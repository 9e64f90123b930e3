from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_cache import hash_token_blocks
from deepinfer_cache.hashing import namespace_root

tokens_st = st.lists(st.integers(0, 2**31 - 1), max_size=60)


def test_matches_the_documented_formula() -> None:
    toks = [5, 7, 11, 13, 17, 19, 23]
    ns = b"tenant-a"
    parent = hashlib.blake2b(
        b"deepinfer-cache/v1" + struct.pack("<I", len(ns)) + ns, digest_size=16
    ).digest()
    assert namespace_root(ns, key_hash="blake2b") == parent
    expect = []
    for i in range(2):
        block = struct.pack("<3i", *toks[3 * i : 3 * i + 3])
        parent = hashlib.blake2b(block, digest_size=16, key=parent).digest()
        expect.append(parent)
    assert hash_token_blocks(toks, 3, ns, key_hash="blake2b") == expect


def test_same_in_a_fresh_process() -> None:
    toks = list(range(1000, 1100))
    code = (
        "from deepinfer_cache import hash_token_blocks as h;"
        "print(','.join(x.hex() for x in h(list(range(1000, 1100)), 16, b'ns')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().split(",") == [x.hex() for x in hash_token_blocks(toks, 16, b"ns")]


@given(tokens_st, st.integers(1, 8))
def test_prefix_property_and_partial_blocks(tokens: list[int], bs: int) -> None:
    full = hash_token_blocks(tokens, bs)
    assert len(full) == len(tokens) // bs
    assert all(len(h) == 16 for h in full)
    for cut in range(0, len(tokens) + 1, max(1, len(tokens) // 4)):
        assert hash_token_blocks(tokens[:cut], bs) == full[: cut // bs]


@given(tokens_st, tokens_st)
def test_different_prefix_different_chain(a: list[int], b: list[int]) -> None:
    ha, hb = hash_token_blocks(a, 2), hash_token_blocks(b, 2)
    for i in range(min(len(ha), len(hb))):
        assert (ha[i] == hb[i]) == (a[: 2 * i + 2] == b[: 2 * i + 2])


def test_namespaces_never_collide() -> None:
    toks = list(range(64))
    a, b, c = (hash_token_blocks(toks, 8, ns) for ns in (b"", b"alice", b"bob"))
    assert not set(a) & set(b) and not set(b) & set(c) and not set(a) & set(c)


def test_list_numpy_torch_agree() -> None:
    toks = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    ref = hash_token_blocks(toks, 4)
    assert hash_token_blocks(np.array(toks, dtype=np.int64), 4) == ref
    assert hash_token_blocks(np.array(toks, dtype=np.int32), 4) == ref
    assert hash_token_blocks(torch.tensor(toks), 4) == ref
    assert hash_token_blocks(tuple(toks), 4) == ref
    assert hash_token_blocks(iter(toks), 4) == ref


@pytest.mark.parametrize("bad", [[1, -1], [2**31], np.array([-3]), np.array([[1, 2]])])
def test_rejects_bad_tokens(bad: object) -> None:
    with pytest.raises(ValueError, match="tokens"):
        hash_token_blocks(bad, 1)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="block_size"):
        hash_token_blocks([1, 2], 0)
    with pytest.raises(TypeError, match="namespace"):
        hash_token_blocks([1, 2], 1, "tenant")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="integers"):
        hash_token_blocks(np.array([1.5]), 1)
    with pytest.raises(TypeError):
        hash_token_blocks(["a"], 1)
