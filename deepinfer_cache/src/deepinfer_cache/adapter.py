"""``KVCacheAdapter``: the engine-facing face of the store.

The engine's KV pool is one tensor, e.g. ``[num_layers, 2, num_blocks, block_size, H, D]``
with the block dimension ``block_dim=2``; the page of engine block ``i`` is
``pool.select(block_dim, i)``. The adapter answers three questions an engine asks per request:
how many prompt tokens are cached, load them into these blocks, save these blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .block_hash_chain import BlockHashChain
from .store import TieredKVStore
from .tiers.base import GatherFn, ScatterFn, torch_gather, torch_scatter
from .tiers.device import DeviceTier

_CHUNK = 64  # blocks per scatter: bounds the temporary a load stacks


class KVCacheAdapter:
    """Connect an engine's paged KV pool to a ``TieredKVStore``.

    ``pool``/``block_dim`` default to the store's first tier when it is a ``DeviceTier`` built
    over the engine pool (the usual set-up: the cache reserves some blocks of that pool).

    >>> import torch
    >>> from deepinfer_cache import HostTier, TieredKVStore
    >>> pool = torch.randn(2, 2, 8, 4, 1, 3)     # [L, 2, blocks, block_size, H, D]
    >>> page = tuple(pool.select(2, 0).shape)
    >>> store = TieredKVStore([HostTier(page, pool.dtype, 1 << 20)], block_size=4)
    >>> kv = KVCacheAdapter(store, 4, pool=pool, block_dim=2)
    >>> kv.save(list(range(9)), b"", [0, 1, 2])
    2
    >>> kv.num_cached_tokens(list(range(12)))
    8
    >>> kv.load(list(range(12)), b"", [5, 6])
    8
    >>> bool((pool[:, :, 5] == pool[:, :, 0]).all())
    True
    """

    def __init__(
        self,
        store: TieredKVStore,
        block_size: int,
        *,
        pool: torch.Tensor | None = None,
        block_dim: int | None = None,
        gather_fn: GatherFn | None = None,
        scatter_fn: ScatterFn | None = None,
        promote: bool = True,
    ) -> None:
        if not isinstance(store, TieredKVStore):
            raise TypeError(f"store must be a TieredKVStore, got {type(store).__name__}")
        if block_size != store.block_size:
            raise ValueError(f"block_size {block_size} must equal the store's {store.block_size}")
        first = store.tiers[0]
        if pool is None:
            if not isinstance(first, DeviceTier):
                raise ValueError("pool is required when the store's first tier is no DeviceTier")
            pool = first.pool
            block_dim = first.block_dim if block_dim is None else block_dim
        bd = 0 if block_dim is None else block_dim
        if not 0 <= bd < pool.dim():
            raise ValueError(f"block_dim must be in [0, {pool.dim()}), got {bd}")
        page_shape = tuple(pool.select(bd, 0).shape)
        if page_shape != store.page_shape or pool.dtype != store.dtype:
            raise ValueError(
                f"pool pages {page_shape} {pool.dtype} must match the store's "
                f"{store.page_shape} {store.dtype}"
            )
        self.store = store
        self.block_size = block_size
        self.pool = pool
        self.block_dim = bd
        self.promote = promote
        self._gather: GatherFn = gather_fn if gather_fn is not None else torch_gather
        self._scatter: ScatterFn = scatter_fn if scatter_fn is not None else torch_scatter

    def hash_chain(self, namespace: bytes = b"") -> BlockHashChain:
        """A block-hash chain for one growing sequence (``store.hash_chain``): pass it as
        ``block_hashes=`` to the calls below and each block is hashed once, not once a call."""
        return self.store.hash_chain(namespace)

    def num_cached_tokens(
        self,
        tokens: Sequence[int] | Any,
        namespace: bytes = b"",
        *,
        block_hashes: BlockHashChain | None = None,
    ) -> int:
        """Cached prompt tokens (full blocks only, any tier); counted in the hit-rate stats."""
        return self.store.lookup(tokens, namespace, block_hashes=block_hashes).num_tokens

    def load(
        self,
        tokens: Sequence[int] | Any,
        namespace: bytes,
        device_block_ids: Sequence[int],
        *,
        block_hashes: BlockHashChain | None = None,
    ) -> int:
        """Copy the KV of the leading cached blocks into engine blocks ``device_block_ids``
        (block j of the prompt -> ``device_block_ids[j]``). Returns tokens loaded, a multiple
        of ``block_size``; a corrupt or vanished block ends the load early."""
        ids = self._check_ids(device_block_ids)
        if not ids:
            return 0
        res = self.store.fetch(
            tokens,
            namespace,
            max_blocks=len(ids),
            promote=self.promote,
            device=self.pool.device,
            block_hashes=block_hashes,
        ).result()
        for start in range(0, res.num_blocks, _CHUNK):
            chunk = res.pages[start : start + _CHUNK]
            dst = torch.tensor(ids[start : start + len(chunk)], dtype=torch.long)
            src = torch.stack(chunk).movedim(0, self.block_dim)
            self._scatter(self.pool, dst, src, block_dim=self.block_dim)
        return res.num_tokens

    def share(
        self,
        tokens: Sequence[int] | Any,
        namespace: bytes,
        max_blocks: int,
        *,
        block_hashes: BlockHashChain | None = None,
    ) -> tuple[list[int], Callable[[], None]]:
        """The engine blocks that already hold the leading cached blocks of ``tokens``: the
        store's device tier over this very pool keeps them, so the engine can read them in
        place (no copy). They stay pinned (never evicted or overwritten) until the returned
        ``release()`` is called; ``([], release)`` when the device tier holds none of them."""
        first = self.store.tiers[0]
        if not (isinstance(first, DeviceTier) and first.pool is self.pool):
            return [], _noop
        if first.block_dim != self.block_dim:
            return [], _noop
        ids, hashes = self.store.lease_device(
            tokens, namespace, max_blocks=max_blocks, block_hashes=block_hashes
        )
        released = False

        def release() -> None:
            nonlocal released
            if not released and not self.store.closed:
                released = True
                self.store.release(hashes)

        return ids, release

    def save(
        self,
        tokens: Sequence[int] | Any,
        namespace: bytes,
        device_block_ids: Sequence[int],
        retention: str = "chat",
        *,
        block_hashes: BlockHashChain | None = None,
    ) -> int:
        """Store the KV of the full blocks of ``tokens`` held in engine blocks
        ``device_block_ids``; only blocks the store lacks are copied. Returns blocks newly
        stored."""
        ids = self._check_ids(device_block_ids)
        n = min(len(tokens) // self.block_size, len(ids))
        if n == 0:
            return 0
        prefix = tokens[: n * self.block_size]

        def pages(block_indices: list[int]) -> torch.Tensor:
            sel = torch.tensor([ids[i] for i in block_indices], dtype=torch.long)
            return self._gather(self.pool, sel, block_dim=self.block_dim).movedim(self.block_dim, 0)

        return self.store.store(prefix, pages, retention, namespace, block_hashes=block_hashes)

    def _check_ids(self, device_block_ids: Sequence[int]) -> list[int]:
        n = self.pool.shape[self.block_dim]
        ids = [int(i) for i in device_block_ids]
        if any(not 0 <= i < n for i in ids):
            raise ValueError(f"device_block_ids must be block ids in [0, {n})")
        return ids


def _noop() -> None:
    """Nothing to release."""
