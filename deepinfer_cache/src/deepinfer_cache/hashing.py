"""Chained block hashes that identify a token prefix (and the model and adapters that made it).

Two key schemes (``key_hash``), each a chain over the full blocks ``b_1 .. b_n`` of
``block_size`` tokens, ``lp(x)`` = ``len(x)`` as u32 LE ``|| x``:

``"xxh3_128"`` (the default, key scheme v2)::

    h_0 = XXH3-128(b"deepinfer-cache/v2:xxh3_128" || lp(ns) || lp(model) || lp(extra))
    h_i = XXH3-128(h_{i-1} || tokens of b_i as int32 little-endian [|| x_i])

``"blake2b"`` (cryptographic, key scheme v1: the hashes every earlier release wrote)::

    h_0 = BLAKE2b-128(b"deepinfer-cache/v1" || lp(ns))                       (no model/extra)
    h_0 = BLAKE2b-128(b"deepinfer-cache/v1+k" || lp(ns) || lp(model) || lp(extra))
    h_i = BLAKE2b-128(key = h_{i-1}, message = tokens of b_i as int32 little-endian [|| x_i])

Why two: a lookup of a 77k-token prompt at block size 64 makes 1203 chained calls, and keyed
BLAKE2b costs ~1.5 us each here against ~0.2 us for XXH3-128 (``bench_cache_index.py``), which
decides whether a lookup fits in 2 ms. XXH3-128 is a 128-bit *non-cryptographic* hash: random
collisions are as unlikely as with BLAKE2b-128, but it is not built to resist someone who crafts
colliding prompts on purpose. Tenants are separated by ``namespace`` (it enters ``h_0``, so two
namespaces share no chain); where untrusted users share one namespace and a deliberate
collision matters (cache poisoning), choose ``"blake2b"`` (vLLM's ``sha256`` option plays the
same role). The scheme's name is part of ``h_0``'s input and the functions differ, so a cache
written under one scheme is all misses under the other, never a wrong hit.

``model`` is a weights fingerprint or a name the caller gives; ``extra`` is request-wide key
material (a LoRA adapter id, a prompt-adapter id...); ``x_i`` is optional per-block key material
(``block_extras[i]``, e.g. the content hash of an image whose placeholder tokens fall in block
``i``). The token part has a fixed length, so appending ``x_i`` is unambiguous, and ``h_i``
depends on every token before the end of block ``i``, on the namespace, the model and the extra
material. Nothing random enters (no seeds, no Python ``hash()``), so hashes agree across
processes and machines. A trailing partial block is not hashed: only full blocks are cacheable.

``iter_block_hashes`` yields the hashes lazily (tokens are converted in growing chunks), so a
lookup that misses on the first block pays for that block only.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np
import xxhash

from .native_hash import ChainHasher, chain_hasher
from .native_tokens import list_converter

BlockHash = bytes
"""A 16-byte block hash."""

HASH_SIZE = 16
KEY_HASHES = ("xxh3_128", "blake2b")
"""The key schemes ``key_hash`` accepts (see the module docstring)."""
DEFAULT_KEY_HASH = "xxh3_128"
_ROOT_TAG = b"deepinfer-cache/v1"
_KEYED_ROOT_TAG = b"deepinfer-cache/v1+k"
_XXH3_ROOT_TAG = b"deepinfer-cache/v2:xxh3_128"
_INT32_MAX = 2**31 - 1
_U32 = "I" if array("I").itemsize == 4 else "L"  # a 4-byte unsigned array item
_BIG_ENDIAN = sys.byteorder == "big"


def _as_bytes(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        raise TypeError(f"{name} must be bytes (encode str values, e.g. name.encode())")
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _lp(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def check_key_hash(key_hash: Any) -> str:
    """``key_hash`` if it names a scheme in ``KEY_HASHES``; a ``ValueError`` naming it if not."""
    if key_hash not in KEY_HASHES:
        raise ValueError(f"key_hash must be one of {KEY_HASHES}, got {key_hash!r}")
    return str(key_hash)


def namespace_root(
    namespace: bytes = b"",
    *,
    model: bytes = b"",
    extra: bytes = b"",
    key_hash: str = DEFAULT_KEY_HASH,
) -> BlockHash:
    """Return ``h_0``, the chain's root for ``namespace`` (tenant / cache salt), ``model`` and
    ``extra`` key material under the ``key_hash`` scheme (see the module docstring)."""
    ns = _as_bytes(namespace, "namespace")
    mdl = _as_bytes(model, "model")
    ext = _as_bytes(extra, "extra")
    if check_key_hash(key_hash) == "xxh3_128":
        return xxhash.xxh3_128_digest(_XXH3_ROOT_TAG + _lp(ns) + _lp(mdl) + _lp(ext))
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
    return bytes(_array_to_int32_buffer(arr))


def _array_to_int32_buffer(arr: np.ndarray) -> memoryview:
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu"):
        raise TypeError(f"tokens must be integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _INT32_MAX):
        raise ValueError("tokens must be ids in [0, 2**31 - 1]")
    return memoryview(np.ascontiguousarray(arr, dtype="<i4").data).cast("B")


def _list_to_int32_bytes(tokens: Sequence[Any]) -> bytes:
    return bytes(_list_to_int32_buffer(tokens))


def _list_to_int32_buffer(tokens: Sequence[Any]) -> memoryview:
    """``tokens`` (a list or tuple of ids) as a byte view of little-endian int32s, checked.

    ``array("I", list)`` is the cheapest exact conversion of Python ints measured here
    (~7 ns a token, against ~25 for ``np.array(list, dtype=np.int32)``, ~30 for
    ``np.fromiter`` and ~20 for ``struct.pack``): it reads each int in one C loop and refuses
    negative ids itself; ids >= 2**31 are caught below with one vectorised max. A plain list
    of exact ints takes the C loop of ``native_tokens.py`` first (~1.5 ns a token); anything it
    does not accept comes back here, so what is accepted and refused is the same."""
    fast = list_converter()
    if fast is not None and isinstance(tokens, list | tuple):
        converted = fast(tokens, 0, len(tokens))
        if converted is not None:
            return memoryview(converted.data).cast("B")
    try:
        packed = array(_U32, tokens)
    except OverflowError as exc:
        raise ValueError(f"tokens must be int ids in [0, 2**31 - 1] ({exc})") from exc
    except TypeError as exc:
        raise TypeError("tokens must be a sequence of ints") from exc
    if not packed:
        return memoryview(b"")
    if _BIG_ENDIAN:
        packed.byteswap()
    ids = np.frombuffer(packed, dtype="<u4")
    if int(ids.max()) > _INT32_MAX:
        raise ValueError("tokens must be ids in [0, 2**31 - 1]")
    # ``bool`` is an int subclass that packs as 0/1: a caller bug, refused. Only the positions
    # holding 0 or 1 can be bools, so only those are type-checked.
    for i in np.flatnonzero(ids <= 1).tolist():
        if type(tokens[i]) is bool:
            raise TypeError("tokens must be int ids, got a bool")
    return memoryview(packed).cast("B")


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
    key_hash: str = DEFAULT_KEY_HASH,
) -> Iterator[BlockHash]:
    """Yield the chained hashes of the full blocks of ``tokens`` one at a time. Tokens are
    converted and checked in growing chunks (1, 2, 4, ... blocks; 1, 8, 64, ... in C), so stopping
    after k blocks costs O(k) work. Arguments are checked at the call, tokens as they are
    reached."""
    return chain.from_iterable(
        hash_chunks(tokens, block_size, namespace, model, extra, block_extras, key_hash, 1)
    )


def _check_block_size(block_size: Any) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


def _list_range_to_int32_buffer(tokens: Sequence[Any], lo: int, hi: int) -> memoryview:
    """``tokens[lo:hi]`` as checked int32 bytes; the C loop reads the range in place (a list
    slice would copy it and touch every int's reference count first)."""
    fast = list_converter()
    if fast is not None:
        converted = fast(tokens, lo, hi)
        if converted is not None:
            return memoryview(converted.data).cast("B")
    return _list_to_int32_buffer(tokens[lo:hi])


def _array_range_to_int32_buffer(tokens: np.ndarray, lo: int, hi: int) -> memoryview:
    return _array_to_int32_buffer(tokens[lo:hi])


def _token_source(tokens: Any) -> tuple[Any, Callable[[Any, int, int], memoryview]]:
    """``tokens`` as a sliceable sequence and the function that converts ``tokens[lo:hi]`` to
    checked int32 bytes."""
    toks = as_token_sequence(tokens)
    if isinstance(toks, list | tuple):
        return toks, _list_range_to_int32_buffer
    if not isinstance(toks, np.ndarray):  # a torch tensor
        toks = toks.detach().cpu().numpy()
    if toks.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {toks.shape}")
    if toks.size and toks.dtype.kind not in "iu":
        raise TypeError(f"tokens must be integers, got dtype {toks.dtype}")
    return toks, _array_range_to_int32_buffer


def hash_chunks(
    tokens: Any,
    block_size: int,
    namespace: bytes,
    model: bytes,
    extra: bytes,
    block_extras: Mapping[int, bytes] | None,
    key_hash: str,
    first_chunk: int,
) -> Iterator[list[BlockHash]]:
    """The hash chain in lists of ``first_chunk`` blocks, then twice as many each time (the
    tokens are converted chunk by chunk): a caller that stops early has paid at most twice
    what it used, and the per-block work is a tight loop without a generator step."""
    _check_block_size(block_size)
    parent = namespace_root(namespace, model=model, extra=extra, key_hash=key_hash)
    extras = _check_block_extras(block_extras)
    toks, convert = _token_source(tokens)
    use_xxh3 = key_hash == "xxh3_128"
    native = chain_hasher() if use_xxh3 and extras is None else None
    return _chunks(toks, convert, block_size, parent, extras, use_xxh3, first_chunk, native)


# After the first chunk, tokens are converted up to this many hash chunks ahead: converting
# costs a fixed ~10 us a call (slice, checks) on top of its per-token work, so a 77k-token
# hit converts in 4 calls instead of 11, while a first-block miss still converts one block.
_CONVERT_AHEAD = 8
# A C call costs ~10 us of fixed overhead (buffers, ctypes) and a Python step ~0.4 us a block:
# chunks smaller than this are hashed in Python (a first-block miss stays one block's hash).
_NATIVE_MIN_BLOCKS = 16


def _chunks(
    toks: Any,
    convert: Callable[[Any, int, int], memoryview],
    block_size: int,
    parent: bytes,
    extras: Mapping[int, bytes] | None,
    use_xxh3: bool,
    chunk: int,
    native: ChainHasher | None = None,
) -> Iterator[list[BlockHash]]:
    step = 4 * block_size
    n_blocks = len(toks) // block_size
    # In C a block costs ~30 ns against ~10 us per call, so chunks grow 8x (a 77k-token hit
    # takes 5 calls, not 11); a block in Python costs ~0.4 us, so they double.
    growth = 8 if native is not None else 2
    blake = hashlib.blake2b
    xxh3 = xxhash.xxh3_128_digest
    done = 0
    conv_lo = conv_hi = 0  # the blocks ``view`` holds, converted and checked
    view = memoryview(b"")
    ahead = 1
    while done < n_blocks:
        hi = min(n_blocks, done + chunk)
        if hi > conv_hi:
            conv_lo, conv_hi = done, min(n_blocks, max(hi, done + ahead * chunk))
            view = convert(toks, conv_lo * block_size, conv_hi * block_size)
            ahead = _CONVERT_AHEAD
        out: list[BlockHash] = []
        add = out.append
        base = (done - conv_lo) * step
        if native is not None and hi - done >= _NATIVE_MIN_BLOCKS:  # one C call, same bytes
            out = native(parent, view[base : base + (hi - done) * step], hi - done, step)
            parent = out[-1]
        elif use_xxh3 and extras is None:  # the common case, kept to the bare calls
            for off in range(base, base + (hi - done) * step, step):
                parent = xxh3(parent + view[off : off + step])  # one 16 + 4 bs byte copy
                add(parent)
        else:
            for i in range(done, hi):
                off = base + (i - done) * step
                msg: Any = view[off : off + step]
                if extras is not None and i in extras:
                    msg = bytes(msg) + bytes(extras[i])
                if use_xxh3:
                    parent = xxh3(parent + msg)
                else:
                    parent = blake(msg, digest_size=HASH_SIZE, key=parent).digest()
                add(parent)
        yield out
        done = hi
        chunk *= growth


def hash_blocks_from(
    parent: BlockHash, tokens: Any, block_size: int, key_hash: str = DEFAULT_KEY_HASH
) -> list[BlockHash]:
    """Continue a chain: the hashes of the full blocks of ``tokens`` chained from ``parent``
    (the hash of the block before them, or a ``namespace_root``). No per-block key material."""
    if not isinstance(parent, bytes) or len(parent) != HASH_SIZE:
        raise ValueError(f"parent must be a {HASH_SIZE}-byte block hash")
    _check_block_size(block_size)
    toks, convert = _token_source(tokens)
    n_blocks = len(toks) // block_size
    if n_blocks == 0:
        return []
    use_xxh3 = check_key_hash(key_hash) == "xxh3_128"
    native = chain_hasher() if use_xxh3 else None
    return next(_chunks(toks, convert, block_size, parent, None, use_xxh3, n_blocks, native))


def hash_token_blocks(
    tokens: Sequence[int] | Any,
    block_size: int,
    namespace: bytes = b"",
    *,
    model: bytes = b"",
    extra: bytes = b"",
    block_extras: Mapping[int, bytes] | None = None,
    key_hash: str = DEFAULT_KEY_HASH,
) -> list[BlockHash]:
    """Chained 128-bit hashes of the full blocks of ``tokens`` under the ``key_hash`` scheme
    (``"xxh3_128"``, the default, or the cryptographic ``"blake2b"``; see the module docstring).

    >>> hs = hash_token_blocks(list(range(10)), 4)
    >>> len(hs), len(hs[0])
    (2, 16)
    >>> hash_token_blocks(list(range(8)), 4, model=b"llama-3-8b") != hs
    True
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    check_key_hash(key_hash)
    toks = as_token_sequence(tokens)
    n_blocks = len(toks) // block_size
    # One conversion and one check for the whole prompt instead of doubling chunks.
    chunks = hash_chunks(
        toks, block_size, namespace, model, extra, block_extras, key_hash, max(1, n_blocks)
    )
    return next(chunks, [])
