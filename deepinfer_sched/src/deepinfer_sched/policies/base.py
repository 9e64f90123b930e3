"""The seams of the scheduler: small Protocols that each policy implements.

Policies never see simulator internals. They read instances through :class:`InstanceView`
and requests through :class:`RequestView`, so the same object can drive the simulator, a
real engine's gateway, or a unit test built from a few hand-written records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "AdmissionPolicy",
    "CostModelLike",
    "DecodePairing",
    "InstanceView",
    "MigrationMove",
    "MigrationPolicy",
    "PDPolicy",
    "RequestView",
    "Router",
]


@runtime_checkable
class RequestView(Protocol):
    """What a policy may read about a request (``TraceRequest`` satisfies it).

    ``input_len`` is the number of tokens still to prefill from scratch (for a request that
    is re-prefilled after a fault or a preemption it includes the tokens generated so far).
    """

    @property
    def request_id(self) -> int: ...
    @property
    def input_len(self) -> int: ...
    @property
    def output_len(self) -> int: ...
    @property
    def block_hashes(self) -> tuple[int, ...]: ...
    @property
    def tenant(self) -> str: ...
    @property
    def priority(self) -> int: ...


@runtime_checkable
class InstanceView(Protocol):
    """What a policy may read about one serving instance.

    Token counts are KV tokens: ``kv_used_tokens`` is the KV held by running and
    partially-prefilled sequences, ``waiting_tokens`` the uncached prompt tokens queued for
    prefill. ``cached_prefix_blocks`` peeks at the local prefix cache without touching its
    LRU order; ``reachable_prefix_blocks`` also counts blocks a shared SSD tier can supply.
    """

    @property
    def instance_id(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def waiting_tokens(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    @property
    def kv_used_tokens(self) -> int: ...
    @property
    def kv_capacity_tokens(self) -> int: ...
    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int: ...
    def reachable_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int: ...
    def estimated_queue_time_s(self) -> float: ...


class CostModelLike(Protocol):
    """The slice of a cost model that policies use (``RooflineCostModel`` satisfies it)."""

    def prefill_time(self, new_tokens: int, cached_tokens: int) -> float: ...
    def decode_step_time(self, batch_size: int, total_context_tokens: int) -> float: ...
    def kv_transfer_time(self, num_tokens: int) -> float: ...
    def ssd_fetch_time(self, num_tokens: int) -> float: ...


class Router(Protocol):
    """Picks the instance that prefills a request.

    ``candidates`` is non-empty and holds only live instances of the right role; the router
    returns one of them. Routers may keep state (a round-robin cursor, a seeded RNG) but no
    module-level state.
    """

    def route(self, request: RequestView, candidates: Sequence[InstanceView]) -> InstanceView: ...


class PDPolicy(Protocol):
    """Where prefill runs relative to decode.

    ``disaggregated`` False means every instance prefills and decodes its own requests.
    When True, a request prefills on the prefill pool unless ``prefill_on_decode`` says the
    uncached part is cheap enough to prefill directly on its decode instance.
    """

    @property
    def disaggregated(self) -> bool: ...
    def prefill_on_decode(self, uncached_tokens: int) -> bool: ...


class DecodePairing(Protocol):
    """Picks the decode instance that receives a prefilled request's KV.

    Returns None when no candidate has room for ``kv_tokens`` (the caller retries later).
    """

    def pick(
        self, request: RequestView, candidates: Sequence[InstanceView], kv_tokens: int
    ) -> InstanceView | None: ...


class AdmissionPolicy(Protocol):
    """Accepts or rejects a request at arrival.

    Returns None to admit, or a short reason string to reject. ``predicted_ttft_s`` is lazy:
    policies that do not need the prediction never pay for it.
    """

    def check(
        self, request: RequestView, now_s: float, predicted_ttft_s: Callable[[], float]
    ) -> str | None: ...


@dataclass(frozen=True, slots=True)
class MigrationMove:
    """Move decode sequences holding about ``kv_tokens`` KV tokens from ``src`` to ``dst``."""

    src: int
    dst: int
    kv_tokens: int


class MigrationPolicy(Protocol):
    """Rebalances decode load; called periodically with the live decode-capable instances."""

    @property
    def interval_s(self) -> float: ...
    def plan(self, instances: Sequence[InstanceView]) -> list[MigrationMove]: ...
