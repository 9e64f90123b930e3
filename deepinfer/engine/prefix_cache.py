"""The engine's seam to a prefix KV cache (implemented by `deepinfer_cache`'s adapter)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from deepinfer.engine.sequence import Sequence as Sequence_


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


@runtime_checkable
class KeepsBlockHashes(Protocol):
    """A prefix cache that lets the engine keep each sequence's chained block hashes
    (`deepinfer_cache.KVCacheAdapter.hash_chain`): the engine holds one chain per sequence and
    passes it as ``block_hashes=`` to every call, so each block is hashed once over the
    sequence's life instead of on every lookup, load, share and save (vLLM keeps
    ``Request.block_hashes`` for the same reason)."""

    def hash_chain(self, namespace: bytes = b"") -> Any: ...


def block_hashes(cache: PrefixCache, seq: Sequence_) -> dict[str, Any]:
    """The keyword arguments that hand ``seq``'s block-hash chain to ``cache`` (made on first
    use and kept on the sequence); none for a cache that does not keep chains."""
    if not isinstance(cache, KeepsBlockHashes):
        return {}
    if seq.block_hashes is None:
        seq.block_hashes = cache.hash_chain(seq.namespace)
    return {"block_hashes": seq.block_hashes}
