"""Reading a tiered store: ``lookup`` (what is cached, hashing lazily outside the lock),
``fetch`` (the blocks, on an I/O thread) and device leases (layer of ``TieredKVStore``; see
``store.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from itertools import filterfalse
from typing import Any

import torch

from .block_hash_chain import BlockHashChain, present_prefix
from .hashing import BlockHash, as_token_sequence, hash_chunks
from .results import FetchResult, LookupResult
from .store_keys import StoreKeys


class StoreReads(StoreKeys):
    """Look up, fetch and lease cached blocks."""

    def lookup(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        record: bool = True,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> LookupResult:
        """How many leading full blocks of ``tokens`` are cached, and in which tiers.

        Hashes are computed lazily, outside the store lock: a miss on the first block costs
        one block hash, a miss on block k at most 8 k + 1 with the C chain (~30 ns a block)
        and 2 k + 1 without it. With ``block_hashes`` (a :class:`BlockHashChain` kept by the
        caller) only blocks the chain has not seen are hashed. The count is an upper bound of what
        ``fetch`` returns: a block whose payload turns out corrupt when read is a miss then (and
        removed); ``scrub()`` verifies every disk block ahead of time.
        """
        toks = as_token_sequence(tokens)
        computed: list[BlockHash] = []
        if block_hashes is not None:  # hashed already: probe up to the first miss only
            have = self.hashes(
                toks, namespace, extra=extra, block_extras=block_extras, block_hashes=block_hashes
            )
            probe = have[: present_prefix(self.index._ids, have) + 1]
            chunks: Any = iter([probe] if probe else [])
        else:
            chunks = hash_chunks(
                toks,
                self.block_size,
                namespace,
                self.model,
                extra,
                block_extras,
                self.key_hash,
                1,
            )
        # Hash outside the store lock, in growing chunks (1, 8, 64... blocks in C; 1, 2, 4...
        # in Python), stopping after the first block the index lacks (dict membership tests are atomic under the GIL). The
        # index never holds a block without its parent, so a chunk whose last block is known
        # is known whole: one probe per chunk. The locked match below re-checks every block.
        known = self.index._ids
        for chunk in chunks:
            if chunk[-1] in known:
                computed += chunk
                continue
            missing = next(filterfalse(known.__contains__, chunk))  # chunk[-1] at the latest
            computed += chunk[: chunk.index(missing) + 1]
            break
        with self._lock:
            self._check_open()
            self._drain_failures()
            m = self.index.match(computed)
            per_tier = [0] * len(self.tiers)
            for mask in set(m.tiers):  # a few distinct masks, each counted in C
                n = m.tiers.count(mask)
                per_tier[(mask & -mask).bit_length() - 1] += n
            if record:
                self._c["lookups"] += 1
                self._c["query_tokens"] += len(toks)
                self._c["hit_tokens"] += m.num_blocks * self.block_size
                for i, n in enumerate(per_tier):
                    self._tier_c[i]["hit_blocks"] += n
        return LookupResult(
            m.num_blocks,
            m.num_blocks * self.block_size,
            {t.name: n for t, n in zip(self.tiers, per_tier)},
            computed,
        )

    def fetch(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        max_blocks: int | None = None,
        promote: bool = True,
        device: torch.device | str | None = None,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> Future[FetchResult]:
        """Read the leading cached blocks (promoting host/disk ones to the fastest tier) on an
        I/O thread. A corrupt block ends the result early and is quarantined, never served.
        With ``refresh_on_hit`` (default) the blocks' TTLs restart from now."""
        if max_blocks is not None and (
            isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 0
        ):
            raise ValueError(f"max_blocks must be None or an int >= 0, got {max_blocks!r}")
        hashes = self.hashes(
            tokens, namespace, extra=extra, block_extras=block_extras, block_hashes=block_hashes
        )
        hashes = hashes[:max_blocks]
        with self._lock:
            self._check_open()
            self._drain_failures()
            self.index.match(hashes)
            n = self.index.pin(hashes)
            if self.refresh_on_hit and n:
                self._refresh(hashes[:n], None)
        pinned = hashes[:n]
        target = torch.device(device) if device is not None else self._fast_device()
        try:
            return self._fetchers.submit(self._fetch_job, pinned, promote, target)
        except BaseException:
            with self._lock:
                self.index.unpin(pinned)
            raise

    def lease_device(
        self,
        tokens: Any,
        namespace: bytes = b"",
        *,
        max_blocks: int | None = None,
        extra: bytes = b"",
        block_extras: Mapping[int, bytes] | None = None,
        block_hashes: BlockHashChain | None = None,
    ) -> tuple[list[int], list[BlockHash]]:
        """Pin the leading cached blocks of ``tokens`` that the first tier, a ``DeviceTier``,
        holds, and return their pool block ids (an engine reads them in place instead of
        copying) with the pinned hashes. Pinned blocks are never evicted, demoted or expired;
        hand the hashes to :meth:`release` when done. ``([], [])`` without a device tier."""
        first = self.tiers[0]
        slot_of = getattr(first, "slot_of", None)
        if slot_of is None:
            return [], []
        hashes = self.hashes(
            tokens, namespace, extra=extra, block_extras=block_extras, block_hashes=block_hashes
        )
        hashes = hashes[:max_blocks]
        ids: list[int] = []
        with self._lock:
            self._check_open()
            self._drain_failures()
            for h in hashes:
                slot = slot_of(h) if h in self.index else None
                if slot is None:
                    break
                ids.append(int(slot))
            n = self.index.pin(hashes[: len(ids)])
            if self.refresh_on_hit and n:
                self._refresh(hashes[:n], None)
        return ids[:n], hashes[:n]

    def release(self, hashes: Sequence[BlockHash]) -> None:
        """Unpin blocks pinned by :meth:`lease_device`."""
        with self._lock:
            self.index.unpin(list(hashes))
