"""``BlockHashChain``: a growing sequence's block hashes, each block hashed once.

An engine asks the cache about the same request several times (admission lookup, load, save at
the end), each time with a longer token list. Hashing the whole list on every call costs a
hash per block per call, and converting a Python list of ~77k ids alone takes ~1 ms. vLLM keeps
``Request.block_hashes`` as tokens arrive; this is the same: the chain remembers the hashes of
the full blocks seen so far and hashes only the blocks that have filled up since.

Get one from :meth:`TieredKVStore.hash_chain` (it carries the store's model identity and key
scheme) and pass it as ``block_hashes=`` to ``lookup``/``store``/``fetch``/``lease_device``;
the store checks it was made for the same namespace, model, extra material, scheme and block
size, and otherwise raises.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any

from .hashing import (
    DEFAULT_KEY_HASH,
    BlockHash,
    check_key_hash,
    hash_blocks_from,
    namespace_root,
)


class BlockHashChain:
    """The chained hashes of the full blocks of one growing token sequence.

    The caller promises that the tokens it passes extend the tokens passed before (the first
    ``num_hashed_tokens`` are unchanged); after a rollback, call :meth:`truncate`.

    >>> chain = BlockHashChain(4)
    >>> chain.update(list(range(6)))      # one full block
    1
    >>> chain.update(list(range(13)))     # two more; the first is not hashed again
    3
    >>> from deepinfer_cache import hash_token_blocks
    >>> chain.hashes == hash_token_blocks(list(range(13)), 4)
    True
    """

    def __init__(
        self,
        block_size: int,
        namespace: bytes = b"",
        *,
        model: bytes = b"",
        extra: bytes = b"",
        key_hash: str = DEFAULT_KEY_HASH,
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        self.key_hash = check_key_hash(key_hash)
        self.root = namespace_root(namespace, model=model, extra=extra, key_hash=key_hash)
        self.hashes: list[BlockHash] = []
        self.blocks_hashed = 0  # every block hashed over the chain's life (tests count it)

    @property
    def num_hashed_tokens(self) -> int:
        return len(self.hashes) * self.block_size

    def update(self, tokens: Sequence[int] | Any) -> int:
        """Hash the full blocks of ``tokens`` beyond those already hashed; returns how many
        full blocks the chain now holds."""
        have = len(self.hashes)
        n = len(tokens) // self.block_size
        if n > have:
            parent = self.hashes[-1] if have else self.root
            new = hash_blocks_from(
                parent,
                tokens[have * self.block_size : n * self.block_size],
                self.block_size,
                self.key_hash,
            )
            self.hashes.extend(new)
            self.blocks_hashed += len(new)
        return len(self.hashes)

    def hashes_for(self, tokens: Sequence[int] | Any) -> list[BlockHash]:
        """The hashes of the full blocks of ``tokens`` (a prefix of, or an extension of, the
        tokens seen so far), hashing only blocks not hashed before."""
        n = len(tokens) // self.block_size
        if n > len(self.hashes):
            self.update(tokens)
        return self.hashes[:n]

    def truncate(self, num_tokens: int) -> None:
        """Forget the hashes of blocks past the first ``num_tokens`` tokens (the tokens there
        changed, e.g. rejected speculative tokens rolled back)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        del self.hashes[num_tokens // self.block_size :]

    def matches(self, root: BlockHash, block_size: int, key_hash: str) -> bool:
        """Whether this chain was made for that key root, block size and scheme."""
        return self.root == root and self.block_size == block_size and self.key_hash == key_hash


def present_prefix(known: Container[BlockHash], hashes: Sequence[BlockHash]) -> int:
    """How many leading ``hashes`` ``known`` holds, in O(log n) probes: an index never holds a
    block without its parent, so the known hashes of one chain form a prefix."""
    lo, hi = 0, len(hashes)  # hashes[:lo] known; hashes[hi:] unknown
    if hi and hashes[-1] in known:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if hashes[mid] in known:
            lo = mid + 1
        else:
            hi = mid
    return lo


def chain_hashes(
    store: Any,
    tokens: Sequence[int] | Any,
    namespace: bytes,
    extra: bytes,
    block_extras: Mapping[int, bytes] | None,
    chain: BlockHashChain,
) -> list[BlockHash]:
    """The hashes ``store`` keys ``tokens`` by, read from ``chain`` (hashing only the blocks it
    has not seen). Raises if the chain was made for another namespace, model, extra key
    material, scheme or block size: its hashes would then be another prompt's keys."""
    if not isinstance(chain, BlockHashChain):
        raise TypeError(f"block_hashes must be a BlockHashChain, got {type(chain).__name__}")
    if block_extras:
        raise ValueError(
            "block_extras cannot be combined with block_hashes (no per-block material in a chain)"
        )
    root = namespace_root(namespace, model=store.model, extra=extra, key_hash=store.key_hash)
    if not chain.matches(root, store.block_size, store.key_hash):
        raise ValueError(
            "block_hashes was made for another namespace, model, extra, key_hash or block "
            "size than this call (make it with store.hash_chain(namespace, extra=...))"
        )
    return chain.hashes_for(tokens)
