"""Request traces: one request per arrival, with the chained block ids of its prompt.

A request's prompt is cut into blocks of ``block_size`` tokens; ``block_hashes`` holds one id
per FULL block (the trailing partial block has none). Ids are chained: block ``i``'s id
identifies the whole prefix up to and including block ``i``, so two requests share their
leading ``k`` ids exactly when their first ``k`` blocks are equal. That makes "reusable" a
prefix property: if block ``i`` of a request was seen before, so were blocks ``0..i-1``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import overload

__all__ = [
    "Trace",
    "TraceRequest",
    "TraceStats",
    "check_chained",
    "rechain",
    "rechain_ids",
    "reusable_prefix_blocks",
]


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    ``arrival_s`` is seconds since the trace start; ``input_len``/``output_len`` are token
    counts; ``block_hashes`` has one chained id per full prompt block (see the module doc).
    ``conversation_id`` is -1 when the trace carries no conversation structure.
    """

    request_id: int
    arrival_s: float
    input_len: int
    output_len: int
    block_hashes: tuple[int, ...]
    tenant: str = "default"
    conversation_id: int = -1
    kind: str = "chat"
    priority: int = 0

    def __post_init__(self) -> None:
        if not (self.arrival_s >= 0.0 and math.isfinite(self.arrival_s)):
            raise ValueError(f"arrival_s must be finite and >= 0, got {self.arrival_s}")
        if self.input_len < 0:
            raise ValueError(f"input_len must be >= 0, got {self.input_len}")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if not isinstance(self.block_hashes, tuple):
            raise TypeError(
                f"block_hashes must be a tuple of int, got {type(self.block_hashes).__name__}"
            )
        if len(set(self.block_hashes)) != len(self.block_hashes):
            seen: set[int] = set()
            for pos, h in enumerate(self.block_hashes):
                if h in seen:
                    raise ValueError(
                        f"request {self.request_id}: block_hashes[{pos}] = {h} repeats an "
                        "earlier id of the same request; chained ids identify a whole "
                        "prefix, so one request cannot hold an id twice (load with "
                        "rechain=True to treat the ids as per-block content ids)"
                    )
                seen.add(h)


@dataclass(frozen=True)
class TraceStats:
    """Summary of a trace.

    ``reusable_fraction`` = reusable input tokens / input tokens, where a request's reusable
    tokens are ``block_size`` x the number of its leading blocks already seen in an earlier
    request (an infinite prefix cache that keeps everything, the upper bound any real cache
    can reach).
    """

    num_requests: int
    duration_s: float
    request_rate: float
    mean_input_len: float
    mean_output_len: float
    total_input_tokens: int
    total_output_tokens: int
    reusable_tokens: int
    reusable_fraction: float
    num_conversations: int
    num_tenants: int
    kinds: dict[str, int]


def reusable_prefix_blocks(hashes: tuple[int, ...], seen: set[int]) -> int:
    """Number of leading ``hashes`` present in ``seen``.

    Chaining makes membership monotone along the prefix (seen block ``i`` implies seen
    blocks ``< i``), so a binary search needs O(log n) look-ups instead of n.
    """
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi) // 2
        if hashes[mid] in seen:
            lo = mid + 1
        else:
            hi = mid
    return lo


_ROOT = object()


def check_chained(
    requests: tuple[TraceRequest, ...], where: Callable[[int], str] | None = None
) -> None:
    """Raise ``ValueError`` unless the block ids are prefix-chained: every id has the same
    predecessor (the id before it, or none at position 0) in every request holding it.

    ``where(i)`` names request ``i`` in the message (a file line, say); by default its
    index and ``request_id``. One dict look-up per block.
    """
    parent: dict[int, object] = {}
    for i, r in enumerate(requests):
        prev: object = _ROOT
        for pos, h in enumerate(r.block_hashes):
            p = parent.setdefault(h, prev)
            if p is not prev and p != prev:
                name = where(i) if where else f"request {i} (request_id {r.request_id})"
                before = "no predecessor" if p is _ROOT else f"predecessor {p}"
                now = "no predecessor" if prev is _ROOT else f"predecessor {prev}"
                raise ValueError(
                    f"{name}: hash_ids[{pos}] = {h} has {now} but an earlier request gave it "
                    f"{before}; hash_ids must be prefix-chained (id i names the whole prefix "
                    "up to block i). Load with rechain=True to chain per-block ids."
                )
            prev = h


def rechain_ids(rows: Iterable[Sequence[int]]) -> list[tuple[int, ...]]:
    """Re-number per-request block ids so they are chained: the new id of block ``i`` names
    the pair (new id of block ``i - 1``, old id of block ``i``), so two requests share a new
    id exactly when their old ids agree on the whole prefix up to it. New ids are dense from
    0 in order of first appearance (deterministic). Repeated old ids become distinct."""
    table: dict[tuple[int, int], int] = {}
    out = []
    for ids in rows:
        prev = -1
        new = []
        for h in ids:
            key = (prev, h)
            nid = table.get(key)
            if nid is None:
                nid = table[key] = len(table)
            new.append(nid)
            prev = nid
        out.append(tuple(new))
    return out


def rechain(requests: tuple[TraceRequest, ...]) -> tuple[TraceRequest, ...]:
    """The requests with :func:`rechain_ids` applied to their ``block_hashes``."""
    ids = rechain_ids(r.block_hashes for r in requests)
    return tuple(replace(r, block_hashes=h) for r, h in zip(requests, ids, strict=True))


@dataclass(frozen=True)
class Trace:
    """An immutable, arrival-ordered sequence of requests sharing one ``block_size``.

    Iterating yields the requests in arrival order. ``stats()`` computes the summary (it
    walks the whole trace once, so call it once and keep the result).
    """

    requests: tuple[TraceRequest, ...]
    block_size: int
    name: str = "trace"

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {self.block_size!r}")
        if not isinstance(self.requests, tuple):
            raise TypeError(f"requests must be a tuple, got {type(self.requests).__name__}")
        prev = 0.0
        ids: set[int] = set()
        bs = self.block_size
        for i, r in enumerate(self.requests):
            if r.arrival_s < prev:
                raise ValueError(
                    f"requests must be sorted by arrival_s: request {i} (id {r.request_id}) "
                    f"arrives at {r.arrival_s} before {prev}"
                )
            prev = r.arrival_s
            if len(r.block_hashes) > r.input_len // bs:
                raise ValueError(
                    f"request {r.request_id}: {len(r.block_hashes)} block_hashes but only "
                    f"{r.input_len // bs} full blocks of {bs} tokens in input_len {r.input_len}"
                )
            ids.add(r.request_id)
        if len(ids) != len(self.requests):
            raise ValueError("request_id values must be unique within a trace")

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        return iter(self.requests)

    @overload
    def __getitem__(self, index: int) -> TraceRequest: ...
    @overload
    def __getitem__(self, index: slice) -> Trace: ...
    def __getitem__(self, index: int | slice) -> TraceRequest | Trace:
        if isinstance(index, slice):
            return Trace(self.requests[index], self.block_size, self.name)
        return self.requests[index]

    @property
    def duration_s(self) -> float:
        """Arrival time of the last request minus that of the first (0 for < 2 requests)."""
        if len(self.requests) < 2:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    def scaled(self, load_factor: float) -> Trace:
        """The same requests arriving ``load_factor`` times faster (arrivals divided by it).

        ``load_factor = 2`` doubles the request rate; used to sweep load for goodput curves.
        """
        if not (load_factor > 0.0 and math.isfinite(load_factor)):
            raise ValueError(f"load_factor must be finite and > 0, got {load_factor}")
        inv = 1.0 / load_factor
        reqs = tuple(replace(r, arrival_s=r.arrival_s * inv) for r in self.requests)
        return Trace(reqs, self.block_size, f"{self.name}x{load_factor:g}")

    def stats(self) -> TraceStats:
        """Summary statistics; see :class:`TraceStats` for the reusable-token definition."""
        n = len(self.requests)
        seen: set[int] = set()
        reusable = 0
        total_in = 0
        total_out = 0
        convs: set[int] = set()
        tenants: set[str] = set()
        kinds: dict[str, int] = {}
        bs = self.block_size
        for r in self.requests:
            h = r.block_hashes
            k = reusable_prefix_blocks(h, seen)
            reusable += k * bs
            if k < len(h):
                seen.update(h[k:])
            total_in += r.input_len
            total_out += r.output_len
            if r.conversation_id >= 0:
                convs.add(r.conversation_id)
            tenants.add(r.tenant)
            kinds[r.kind] = kinds.get(r.kind, 0) + 1
        dur = self.duration_s
        return TraceStats(
            num_requests=n,
            duration_s=dur,
            request_rate=(n - 1) / dur if dur > 0 else 0.0,
            mean_input_len=total_in / n if n else 0.0,
            mean_output_len=total_out / n if n else 0.0,
            total_input_tokens=total_in,
            total_output_tokens=total_out,
            reusable_tokens=reusable,
            reusable_fraction=reusable / total_in if total_in else 0.0,
            num_conversations=len(convs),
            num_tenants=len(tenants),
            kinds=dict(sorted(kinds.items())),
        )
