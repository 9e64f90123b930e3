"""The leading matched blocks of a hash chain, found without probing every block.

``PrefixIndex.match`` of a 77k-token prompt (1203 blocks) on a 1M-block index spent most of its
time in 1203 dict probes, each a few cache misses into a 40+ MB table. The index never holds a
block without its parent, so the hashes of one chain that it holds form a prefix: a binary
search finds its length in ~11 probes, and the parent links (a flat array, and a chain stored
together sits in neighbouring ids) give the ids of the blocks above the deepest one. The ids
found that way are checked against the hashes asked for, in one vectorised compare, so a list
that is not one chain (or a hash collision) falls back to probing each block.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from .block_hash_chain import present_prefix

_NONE = -1


def walk_up(parent: array[int], last: int, n: int) -> list[int] | None:
    """The ids of ``last`` and its ``n - 1`` nearest ancestors, root side first; None if the
    chain above ``last`` is shorter."""
    path = [last]
    add = path.append
    i = last
    for _ in range(n - 1):
        i = parent[i]
        if i == _NONE:
            return None
        add(i)
    path.reverse()
    return path


def leading_chain_ids(
    ids: dict[bytes, int],
    keys: bytearray,
    parent: array[int],
    hashes: Sequence[bytes],
) -> tuple[list[int], np.ndarray] | None:
    """The ids of the leading ``hashes`` the index holds (expiry not checked) and the same as
    an int64 array, or None when ``hashes`` is not one chain in the index (the caller then
    probes block by block)."""
    n = present_prefix(ids, hashes)
    if n == 0:
        return [], np.empty(0, dtype=np.int64)
    path = walk_up(parent, ids[hashes[n - 1]], n)
    if path is None:
        return None
    at = np.array(path, dtype=np.int64)
    # The index's keys of those ids must be the hashes asked for, byte for byte. The view of
    # ``keys`` is dropped before returning: a bytearray cannot grow while a view exports it.
    view: Any = np.frombuffer(keys, dtype="V16")
    try:
        same = view[at].tobytes() == b"".join(hashes[:n])
    finally:
        del view
    return (path, at) if same else None


def gather(column: array[Any] | bytearray, at: np.ndarray, dtype: Any) -> np.ndarray:
    """``column[at]`` as a new array, read through a short-lived view (an ``array`` or
    ``bytearray`` cannot be resized while a view of it is alive)."""
    view: Any = np.frombuffer(column, dtype=dtype)
    try:
        out: np.ndarray = view[at]  # fancy indexing copies
        return out
    finally:
        del view
