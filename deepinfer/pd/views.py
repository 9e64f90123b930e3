"""What `deepinfer_sched`'s policies read about PD workers and requests.

The coordinator only knows what it sent and what came back, so the views are built from its
own bookkeeping: requests in flight per worker and the KV tokens they hold. Workers run without
a prefix cache, so no prompt blocks count as cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorkerView:
    """One worker process as an ``InstanceView``."""

    instance_id: int
    block_size: int
    kv_capacity_tokens: int
    role: str
    in_flight: dict[str, int] = field(default_factory=dict)  # request id -> KV tokens

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
        return 0

    def reachable_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        return 0

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
