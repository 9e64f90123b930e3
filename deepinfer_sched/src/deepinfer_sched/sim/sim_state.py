"""The state a ``Simulator``'s parts share, and the few helpers they all use: the event heap,
the routable pools, and finalising a request's record.

The simulator is split by concept into mixins over this state: ``dispatch.py`` (where a
request goes), ``iterations.py`` (instance iterations and KV transfers),
``cluster_events.py`` (faults, migration, autoscaling, timeline samples) and ``engine.py``
(construction and the main loop). The methods one part calls in another are declared below.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from deepinfer_sched.costmodel import CostModel
from deepinfer_sched.report import SLO, RequestRecord
from deepinfer_sched.sim.config import SimConfig
from deepinfer_sched.sim.fleet import Fleet
from deepinfer_sched.sim.instance import Instance, SimClock
from deepinfer_sched.sim.prefix_cache import LRUBlockCache
from deepinfer_sched.sim.request import SimRequest
from deepinfer_sched.sim.result import SimResult
from deepinfer_sched.traces.types import Trace

if TYPE_CHECKING:
    from deepinfer_sched.policies.base import (
        AdmissionPolicy,
        DecodePairing,
        MigrationPolicy,
        PDPolicy,
        Router,
    )

# Event kinds on the heap.
_ITER, _READY, _KV_ARRIVE, _PAIR_RETRY, _FAULT, _MIGRATE, _SAMPLE, _SCALE, _STARTED = range(9)


class SimState:
    """Attributes set by ``Simulator.__init__``, the shared helpers, and the cross-part calls."""

    trace: Trace
    cfg: SimConfig
    cm: CostModel
    router: Router
    pd: PDPolicy
    pairing: DecodePairing
    admission: tuple[AdmissionPolicy, ...]
    migration: MigrationPolicy | None
    ssd: LRUBlockCache | None
    clock: SimClock
    instances: list[Instance]
    fleet: Fleet | None
    pool_both: list[Instance]
    pool_prefill: list[Instance]
    pool_decode: list[Instance]
    pool_decoders: list[Instance]
    events: list[tuple[float, int, int, object, object, int]]
    records: dict[int, RequestRecord]
    result: SimResult
    outstanding: int
    sample_interval_s: float
    _slo: SLO
    _waiting_first: dict[int, float]
    _seq: int
    _next_arrival: int
    _samples: list[tuple[float, float, float, int, int]]

    if TYPE_CHECKING:

        def _dispatch(self, r: SimRequest, now: float, admit: bool) -> None: ...

        def _enqueue(self, inst: Instance, r: SimRequest, now: float, kick: bool) -> None: ...

        def _touch(self, inst: Instance, now: float) -> None: ...

        def _start(self, inst: Instance, now: float) -> None: ...

        def _link(
            self, now: float, seconds: float, dst: Instance, src: Instance | None
        ) -> float: ...

        def _send(
            self, dst: Instance, r: SimRequest, now: float, src: Instance | None = None
        ) -> None: ...

    def _refresh_pools(self) -> None:
        fleet = self.fleet
        alive = [
            x
            for x in self.instances
            if x.alive and (fleet is None or x.instance_id in fleet.routable)
        ]
        self.pool_both = [x for x in alive if x.role == "both"]
        self.pool_prefill = [x for x in alive if x.role == "prefill"]
        self.pool_decode = [x for x in alive if x.role == "decode"]
        self.pool_decoders = self.pool_both or self.pool_decode

    def _push(self, t: float, kind: int, a: object, b: object, tag: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, a, b, tag))

    def _record(self, r: SimRequest, rejected: bool) -> None:
        rid = r.request_id
        if rid in self.records:
            raise RuntimeError(f"request {rid} finalised twice (simulator bug)")
        nan = float("nan")
        cached = max(0, min(r.cached_tokens, r.prompt_len))
        self.records[rid] = RequestRecord(
            rid,
            r.arrival_s,
            nan if rejected else r.first_token_s,
            nan if rejected else r.finish_s,
            r.prompt_len,
            r.output_len,
            0 if rejected else cached,
            rejected,
            -1 if rejected else r.prefill_instance,
            -1 if rejected else r.decode_instance,
            r.tenant,
        )
        self.outstanding -= 1
        r.epoch += 1
        r.inst = None
        self._waiting_first.pop(rid, None)
        if self.fleet is not None:
            rec = self.records[rid]
            self.fleet.finished(r.arrival_s if rejected else r.finish_s, rec.meets(self._slo))

    def _reject(self, r: SimRequest, reason: str) -> None:
        rej = self.result.rejections
        rej[reason] = rej.get(reason, 0) + 1
        self._record(r, True)

    def _complete(self, r: SimRequest, now: float) -> None:
        r.finish_s = now
        if r.decode_instance < 0:
            r.decode_instance = r.prefill_instance
        self._record(r, False)
