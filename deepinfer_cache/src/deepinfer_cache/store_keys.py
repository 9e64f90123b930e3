"""The block hashes of a tiered store: tokens to keys under its key scheme, model and block
size (layer of ``TieredKVStore``; see ``store.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .block_hash_chain import BlockHashChain, chain_hashes
from .hashing import BlockHash, hash_token_blocks
from .store_core import StoreCore


class StoreKeys(StoreCore):
    """Hash tokens the way this store keys its blocks."""

    def hashes(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> list[BlockHash]:
        """The block hashes this store uses for ``tokens`` (its ``model`` folded in)."""
        if block_hashes is not None:
            return chain_hashes(self, tokens, namespace, extra, block_extras, block_hashes)
        return hash_token_blocks(
            tokens,
            self.block_size,
            namespace,
            model=self.model,
            extra=extra,
            block_extras=block_extras,
            key_hash=self.key_hash,
        )

    def hash_chain(self, namespace: bytes = b"", *, extra: bytes = b"") -> BlockHashChain:
        """A :class:`BlockHashChain` under this store's key scheme, model and block size: keep
        one per growing sequence and pass it as ``block_hashes=`` so that each block is hashed
        once over the sequence's life."""
        return BlockHashChain(
            self.block_size, namespace, model=self.model, extra=extra, key_hash=self.key_hash
        )
