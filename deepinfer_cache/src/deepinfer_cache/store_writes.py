"""Writing to a tiered store: ``store`` places a sequence's new full blocks in the fastest
tier that takes them (layer of ``TieredKVStore``; see ``store.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .block_hash_chain import BlockHashChain
from .events import BlockStored
from .hashing import tenant_tag
from .meta import BlockMeta
from .store_keys import StoreKeys

PagesArg = torch.Tensor | Sequence[torch.Tensor] | Callable[[list[int]], torch.Tensor]


class StoreWrites(StoreKeys):
    """Store new blocks."""

    def store(
        self,
        tokens: Any,
        pages: PagesArg,
        retention: str = "chat",
        namespace: bytes = b"",
        *,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> int:
        """Store the full blocks of ``tokens``. ``pages`` is ``[n_full_blocks, *page_shape]``,
        a list of such pages, or a callable returning the pages of the given block indices
        (only new blocks are asked for). Returns how many blocks were newly stored; stops at the
        first block no tier can take (counted as skipped)."""
        hashes = self.hashes(
            tokens, namespace, extra=extra, block_extras=block_extras, block_hashes=block_hashes
        )
        self.index.retention.ttl(retention)  # validates the class name early
        source = self._check_pages(pages, len(hashes))
        with self._lock:
            self._check_open()
            self._drain_failures()
            present = self.index.match(hashes, touch=False).num_blocks
            new = list(range(present, len(hashes)))
            if not new:
                self._refresh(hashes, retention)
                return 0
            data = (
                source[present : len(hashes)] if isinstance(source, torch.Tensor) else source(new)
            )
            self._check_batch(data, len(new), "pages callable")
            stored = 0
            parent = hashes[present - 1] if present else None
            expires = self.clock.now() + self.index.retention.ttl(retention)
            tenant = tenant_tag(namespace) if present == 0 else None
            self._protect = set(hashes[:present])
            try:
                for j, b in enumerate(new):
                    key, page = hashes[b], data[j]
                    meta = BlockMeta(parent, retention, expires, tenant if b == 0 else None)
                    if self._place_new(key, page, meta) is None:
                        self._c["skipped_blocks"] += len(new) - j
                        break
                    if b == 0:
                        self._tenant_of[key] = tenant_tag(namespace)
                    self._protect.add(key)
                    stored += 1
                    parent = key
            finally:
                self._protect = set()
            self._refresh(hashes[: present + stored], retention)
            self._c["stored_blocks"] += stored
            if stored and self._events.active:
                self._events.publish(
                    BlockStored(
                        tuple(hashes[present : present + stored]),
                        hashes[present - 1] if present else None,
                        self.block_size,
                        retention,
                    )
                )
            return stored
