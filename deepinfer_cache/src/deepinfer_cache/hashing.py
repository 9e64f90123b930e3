"""Chained block hashes that identify a token prefix.

For a namespace ``ns`` and full blocks ``b_1 .. b_n`` of ``block_size`` tokens::

    h_0 = BLAKE2b-128(b"deepinfer-cache/v1" || len(ns) as u32 LE || ns)
    h_i = BLAKE2b-128(key = h_{i-1}, message = tokens of b_i as int32 little-endian)

Keying BLAKE2b with the parent hash is its native way to mix a 16-byte prefix in without an
extra compression round, so ``h_i`` depends on every token before the end of block ``i`` and on the namespace. Nothing
random enters (no seeds, no Python ``hash()``), so hashes agree across processes and machines.
A trailing partial block is not hashed: only full blocks are cacheable.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

BlockHash = bytes
"""A 16-byte block hash."""

HASH_SIZE = 16
_ROOT_TAG = b"deepinfer-cache/v1"
_INT32_MAX = 2**31 - 1


def namespace_root(namespace: bytes = b"") -> BlockHash:
    """Return ``h_0``, the chain's root for ``namespace`` (tenant / cache salt)."""
    if isinstance(namespace, str):
        raise TypeError("namespace must be bytes (encode str tenants, e.g. name.encode())")
    if not isinstance(namespace, bytes | bytearray | memoryview):
        raise TypeError(f"namespace must be bytes, got {type(namespace).__name__}")
    ns = bytes(namespace)
    return hashlib.blake2b(
        _ROOT_TAG + struct.pack("<I", len(ns)) + ns, digest_size=HASH_SIZE
    ).digest()


def tokens_to_int32_bytes(tokens: Any) -> bytes:
    """Token ids as little-endian int32 bytes; rejects ids outside ``[0, 2**31 - 1]``."""
    if isinstance(tokens, np.ndarray):
        arr = tokens
        if arr.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
        if arr.size and (arr.dtype.kind not in "iu"):
            raise TypeError(f"tokens must be integers, got dtype {arr.dtype}")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _INT32_MAX):
            raise ValueError("tokens must be ids in [0, 2**31 - 1]")
        return arr.astype("<i4", copy=False).tobytes()
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor
        return tokens_to_int32_bytes(tokens.detach().cpu().numpy())
    if not isinstance(tokens, list | tuple):
        tokens = list(tokens)
    try:
        # struct packs little-endian explicitly and is the fastest stdlib path from a list.
        data = struct.pack(f"<{len(tokens)}i", *tokens)
    except struct.error as exc:
        if not all(isinstance(t, int | np.integer) for t in tokens):
            raise TypeError("tokens must be a sequence of ints") from exc
        raise ValueError(f"tokens must be int ids in [0, 2**31 - 1] ({exc})") from exc
    if data and int(np.frombuffer(data, dtype="<i4").min()) < 0:
        raise ValueError("tokens must be ids in [0, 2**31 - 1] (found a negative id)")
    return data


def hash_token_blocks(
    tokens: Sequence[int] | Any, block_size: int, namespace: bytes = b""
) -> list[BlockHash]:
    """Chained 128-bit hashes of the full blocks of ``tokens`` (see the module docstring).

    >>> hs = hash_token_blocks(list(range(10)), 4)
    >>> len(hs), len(hs[0])
    (2, 16)
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    data = tokens_to_int32_bytes(tokens)
    step = 4 * block_size
    n_blocks = len(data) // step
    parent = namespace_root(namespace)
    out: list[BlockHash] = []
    append = out.append
    blake = hashlib.blake2b
    view = memoryview(data)
    for i in range(n_blocks):
        parent = blake(view[i * step : (i + 1) * step], digest_size=HASH_SIZE, key=parent).digest()
        append(parent)
    return out
