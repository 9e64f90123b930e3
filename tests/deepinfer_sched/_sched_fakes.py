"""Hand-built instance and request records for policy unit tests."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FakeInstance:
    instance_id: int
    num_waiting: int = 0
    waiting_tokens: int = 0
    num_running: int = 0
    kv_used_tokens: int = 0
    kv_capacity_tokens: int = 100_000
    block_size: int = 16
    cached: tuple[int, ...] = ()
    ssd: tuple[int, ...] = ()
    queue_s: float = 0.0
    peeks: list[int] = field(default_factory=list)

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        n = 0
        for h in block_hashes:
            if h not in self.cached:
                break
            n += 1
        return n

    def reachable_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        n = 0
        for h in block_hashes:
            if h not in self.cached and h not in self.ssd:
                break
            n += 1
        return n

    def estimated_queue_time_s(self) -> float:
        return self.queue_s


@dataclass
class FakeRequest:
    request_id: int = 0
    input_len: int = 64
    output_len: int = 8
    block_hashes: tuple[int, ...] = (1, 2, 3, 4)
    tenant: str = "default"
    priority: int = 0


class LinearCost:
    """Prefill 1 ms per new token, decode 10 ms + 1 us per context token, transfer 0.1 ms
    per token, SSD 0.2 ms per token."""

    kv_bytes_per_token = 1000

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        return 1e-3 * new_tokens

    def decode_step_time(self, batch_size: int, total_context_tokens: int) -> float:
        return 0.0 if batch_size == 0 else 0.01 + 1e-6 * total_context_tokens

    def kv_transfer_time(self, num_tokens: int) -> float:
        return 1e-4 * num_tokens

    def ssd_fetch_time(self, num_tokens: int) -> float:
        return 2e-4 * num_tokens

    def kv_capacity_tokens(self, memory_fraction: float = 0.9) -> int:
        return 10_000
