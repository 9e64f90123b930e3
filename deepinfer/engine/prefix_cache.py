"""The engine's seam to a prefix KV cache (implemented by `deepinfer_cache`'s adapter)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


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
