"""The engine's seam to a prefix KV cache (implemented by `deepinfer_cache`'s adapter)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable


class PrefixCache(Protocol):
    """What the engine needs from a prefix cache; `deepinfer_cache.KVCacheAdapter` fits it.

    All counts are in tokens and cover full blocks only. ``load`` copies cached KV into the
    given engine blocks (leading blocks first); ``save`` stores the KV of full blocks held in
    the given engine blocks.
    """

    def num_cached_tokens(self, tokens: Sequence[int], namespace: bytes = b"") -> int: ...

    def load(
        self, tokens: Sequence[int], namespace: bytes, device_block_ids: Sequence[int]
    ) -> int: ...

    def save(
        self,
        tokens: Sequence[int],
        namespace: bytes,
        device_block_ids: Sequence[int],
        retention: str = "chat",
    ) -> int: ...


@runtime_checkable
class SharesDeviceBlocks(Protocol):
    """A prefix cache whose device tier lives in the engine's own KV pool can hand out the
    blocks that hold a prefix instead of copying them (`deepinfer_cache.KVCacheAdapter.share`).

    ``share`` returns the engine block ids of the leading cached blocks (at most
    ``max_blocks``) and a ``release`` to call once the engine stops reading them; until then
    the cache neither evicts nor overwrites them.
    """

    def share(
        self, tokens: Sequence[int], namespace: bytes, max_blocks: int
    ) -> tuple[list[int], Callable[[], None]]: ...
