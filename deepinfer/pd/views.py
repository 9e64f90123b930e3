"""What `deepinfer_sched`'s policies read about PD workers and requests.

The coordinator only knows what it sent and what came back, so the views are built from its
own bookkeeping: requests in flight per worker, the KV tokens they hold and, for prefill
workers with a prefix cache, the block hashes of the prompts it handed them (each worker stores
a prompt's full blocks at hand-off). That record is an estimate: a block the worker has since
evicted still counts, which costs a cache miss, never a wrong result.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import takewhile

from deepinfer_cache import DEFAULT_KEY_HASH

# Blocks remembered per prefill worker (least recently sent forgotten first). The default tiers
# hold ~13k SmolLM2 blocks (1 GiB host + 8 GiB disk at 0.7 MiB per 16-token block); 65k
# entries cost the coordinator ~7 MB per worker.
CACHE_VIEW_BLOCKS = 1 << 16


@dataclass
class WorkerView:
    """One worker process as an ``InstanceView``."""

    instance_id: int
    block_size: int
    kv_capacity_tokens: int
    role: str
    in_flight: dict[str, int] = field(default_factory=dict)  # request id -> KV tokens
    # Prompt block hashes handed to this worker, in LRU order (empty when it keeps no cache).
    cached: OrderedDict[int, None] = field(default_factory=OrderedDict)
    cache_view_blocks: int = CACHE_VIEW_BLOCKS
    # The worker's block-key scheme and key material (from its ``ready``): prompts routed to
    # it are hashed with them.
    hash_model: bytes = b""
    key_hash: str = DEFAULT_KEY_HASH

    def remember(self, block_hashes: Sequence[int]) -> None:
        """Record that the worker now holds these blocks (most recent last)."""
        for h in block_hashes:
            self.cached[h] = None
            self.cached.move_to_end(h)
        while len(self.cached) > self.cache_view_blocks:
            self.cached.popitem(last=False)

    @property
    def num_waiting(self) -> int:
        return 0

    @property
    def waiting_tokens(self) -> int:
        return 0

    @property
    def num_running(self) -> int:
        return len(self.in_flight)

    @property
    def kv_used_tokens(self) -> int:
        return sum(self.in_flight.values())

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        """Leading blocks of ``block_hashes`` this worker is believed to hold."""
        return sum(1 for _ in takewhile(self.cached.__contains__, block_hashes))

    def reachable_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        return self.cached_prefix_blocks(block_hashes)

    def estimated_queue_time_s(self) -> float:
        return 0.0


@dataclass(frozen=True)
class PDRequestView:
    """One request as a ``RequestView``."""

    request_id: int
    input_len: int
    output_len: int
    tenant: str = ""
    priority: int = 0
    block_hashes: tuple[int, ...] = ()
