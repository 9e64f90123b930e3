"""Chained block hashes that identify a token prefix (and the model and adapters that made it).

For a namespace ``ns`` and full blocks ``b_1 .. b_n`` of ``block_size`` tokens::

    h_0 = BLAKE2b-128(b"deepinfer-cache/v1" || len(ns) as u32 LE || ns)
    h_i = BLAKE2b-128(key = h_{i-1}, message = tokens of b_i as int32 little-endian [|| x_i])

When a model identity ``model`` (a weights fingerprint or a name the caller gives) or
request-wide extra key material ``extra`` (a LoRA adapter id, a prompt-adapter id...) is given,
the root folds them in too, each length-prefixed so no two inputs collide::

    h_0 = BLAKE2b-128(b"deepinfer-cache/v1+k" || lp(ns) || lp(model) || lp(extra))

``x_i`` is optional per-block key material (``block_extras[i]``, e.g. the content hash of an
image whose placeholder tokens fall in block ``i``); the token part has a fixed length, so
appending it is unambiguous. Keying BLAKE2b with the parent hash is its native way to mix a
16-byte prefix in without an extra compression round, so ``h_i`` depends on every token before
the end of block ``i``, on the namespace, the model and the extra material. Nothing random
enters (no seeds, no Python ``hash()``), so hashes agree across processes and machines. A
trailing partial block is not hashed: only full blocks are cacheable.

``iter_block_hashes`` yields the hashes lazily (tokens are converted in growing chunks), so a
lookup that misses on the first block pays for that block only.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

BlockHash = bytes
"""A 16-byte block hash."""

HASH_SIZE = 16
_ROOT_TAG = b"deepinfer-cache/v1"
_KEYED_ROOT_TAG = b"deepinfer-cache/v1+k"
_INT32_MAX = 2**31 - 1


def _as_bytes(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        raise TypeError(f"{name} must be bytes (encode str values, e.g. name.encode())")
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _lp(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def namespace_root(namespace: bytes = b"", *, model: bytes = b"", extra: bytes = b"") -> BlockHash:
    """Return ``h_0``, the chain's root for ``namespace`` (tenant / cache salt), ``model`` and
    ``extra`` key material (see the module docstring)."""
    ns = _as_bytes(namespace, "namespace")
    mdl = _as_bytes(model, "model")
    ext = _as_bytes(extra, "extra")
    if not mdl and not ext:
        msg = _ROOT_TAG + _lp(ns)
    else:
        msg = _KEYED_ROOT_TAG + _lp(ns) + _lp(mdl) + _lp(ext)
    return hashlib.blake2b(msg, digest_size=HASH_SIZE).digest()


def tenant_tag(namespace: bytes = b"") -> bytes:
    """A fixed-size tag of ``namespace`` recorded with first blocks (``BlockMeta.tenant``)."""
    ns = _as_bytes(namespace, "namespace")
    return hashlib.blake2b(b"deepinfer-cache/tenant" + ns, digest_size=HASH_SIZE).digest()


def as_token_sequence(tokens: Any) -> Any:
    """``tokens`` as something with ``len`` and slicing: lists, tuples, numpy arrays and torch
    tensors pass through; any other iterable (a generator, a ``range``...) is read into a list."""
    if isinstance(tokens, list | tuple | np.ndarray):
        return tokens
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor
        return tokens
    if isinstance(tokens, str | bytes | bytearray):
        raise TypeError("tokens must be a sequence of int token ids, got a string")
    try:
        return list(tokens)
    except TypeError:
        raise TypeError(f"tokens must be a sequence of ints, got {type(tokens).__name__}") from None


def _array_to_int32_bytes(arr: np.ndarray) -> bytes:
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu"):
        raise TypeError(f"tokens must be integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _INT32_MAX):
        raise ValueError("tokens must be ids in [0, 2**31 - 1]")
    return arr.astype("<i4", copy=False).tobytes()


def _list_to_int32_bytes(tokens: Sequence[Any]) -> bytes:
    try:
        # Unsigned packing rejects negative ids in C; ids >= 2**31 are caught below.
        data = struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error as exc:
        if not all(isinstance(t, int | np.integer) for t in tokens):
            raise TypeError("tokens must be a sequence of ints") from exc
        raise ValueError(f"tokens must be int ids in [0, 2**31 - 1] ({exc})") from exc
    if not data:
        return data
    ids = np.frombuffer(data, dtype="<u4")
    if int(ids.max()) > _INT32_MAX:
        raise ValueError("tokens must be ids in [0, 2**31 - 1]")
    # ``bool`` is an int subclass that struct packs as 0/1: a caller bug, refused. Only the
    # positions holding 0 or 1 can be bools, so only those are type-checked.
    for i in np.flatnonzero(ids <= 1).tolist():
        if type(tokens[i]) is bool:
            raise TypeError("tokens must be int ids, got a bool")
    return data


def tokens_to_int32_bytes(tokens: Any) -> bytes:
    """Token ids as little-endian int32 bytes; rejects ids outside ``[0, 2**31 - 1]`` and
    booleans."""
    if isinstance(tokens, np.ndarray):
        return _array_to_int32_bytes(tokens)
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor
        return _array_to_int32_bytes(tokens.detach().cpu().numpy())
    return _list_to_int32_bytes(as_token_sequence(tokens))


def _check_block_extras(block_extras: Any) -> Mapping[int, bytes] | None:
    if block_extras is None or (isinstance(block_extras, Mapping) and not block_extras):
        return None
    if not isinstance(block_extras, Mapping):
        raise TypeError("block_extras must map block indices to bytes")
    for i, v in block_extras.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"block_extras keys must be block indices >= 0, got {i!r}")
        _as_bytes(v, f"block_extras[{i}]")
    return block_extras


def iter_block_hashes(
    tokens: Sequence[int] | Any,
    block_size: int,
    namespace: bytes = b"",
    *,
    model: bytes = b"",
    extra: bytes = b"",
    block_extras: Mapping[int, bytes] | None = None,
) -> Iterator[BlockHash]:
    """Yield the chained hashes of the full blocks of ``tokens`` one at a time. List tokens are
    converted and checked in chunks that double in size (1, 1, 2, 4, ... blocks), so stopping
    after k blocks costs O(k) work."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    parent = namespace_root(namespace, model=model, extra=extra)
    extras = _check_block_extras(block_extras)
    toks = as_token_sequence(tokens)
    step = 4 * block_size
    n_blocks = len(toks) // block_size
    blake = hashlib.blake2b
    lazy = isinstance(toks, list | tuple)
    view = memoryview(b"" if lazy else tokens_to_int32_bytes(toks))
    done = 0  # blocks whose bytes are in ``view``, which starts at block ``base``
    base = 0
    chunk = 1
    for i in range(n_blocks):
        if lazy and i >= done:
            hi = min(n_blocks, done + chunk)
            view = memoryview(_list_to_int32_bytes(toks[done * block_size : hi * block_size]))
            base, done = done, hi
            chunk *= 2
        off = (i - base) * step
        msg: Any = view[off : off + step]
        if extras is not None and i in extras:
            msg = bytes(msg) + bytes(extras[i])
        parent = blake(msg, digest_size=HASH_SIZE, key=parent).digest()
        yield parent


def hash_token_blocks(
    tokens: Sequence[int] | Any,
    block_size: int,
    namespace: bytes = b"",
    *,
    model: bytes = b"",
    extra: bytes = b"",
    block_extras: Mapping[int, bytes] | None = None,
) -> list[BlockHash]:
    """Chained 128-bit hashes of the full blocks of ``tokens`` (see the module docstring).

    >>> hs = hash_token_blocks(list(range(10)), 4)
    >>> len(hs), len(hs[0])
    (2, 16)
    >>> hash_token_blocks(list(range(8)), 4, model=b"llama-3-8b") != hs
    True
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    toks = as_token_sequence(tokens)
    if isinstance(toks, list | tuple) and len(toks) >= 4 * block_size:
        # Whole-list path: one conversion and one check instead of doubling chunks.
        toks = np.frombuffer(_list_to_int32_bytes(toks), dtype="<i4")
    return list(
        iter_block_hashes(
            toks, block_size, namespace, model=model, extra=extra, block_extras=block_extras
        )
    )
