"""The discrete-event loop: arrivals, instance iterations, KV transfers, faults, migration.

One heap of timestamped events (ties broken by insertion order, so a seed fixes the whole
run). Arrivals are merged from the sorted trace instead of being pushed, and each instance
has at most one iteration event in flight, so the heap stays small.

This module builds the simulator and runs the loop; the event handlers live in
``dispatch.py``, ``iterations.py`` and ``cluster_events.py`` over the shared state of
``sim_state.py``, and the outcome is ``result.py``'s ``SimResult``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from deepinfer_sched.costmodel import CostModel, RooflineCostModel, load_hardware, load_model
from deepinfer_sched.report import SLO, RequestRecord
from deepinfer_sched.sim.acceptance import make_steps_for
from deepinfer_sched.sim.cluster_events import SimClusterEvents
from deepinfer_sched.sim.config import InstanceType, SimConfig
from deepinfer_sched.sim.dispatch import SimDispatch
from deepinfer_sched.sim.fleet import Fleet
from deepinfer_sched.sim.instance import Instance, SimClock
from deepinfer_sched.sim.iterations import SimIterations
from deepinfer_sched.sim.prefix_cache import LRUBlockCache
from deepinfer_sched.sim.request import SimRequest
from deepinfer_sched.sim.result import SimResult
from deepinfer_sched.sim.sim_state import (
    _FAULT,
    _ITER,
    _KV_ARRIVE,
    _MIGRATE,
    _PAIR_RETRY,
    _READY,
    _SAMPLE,
    _SCALE,
    _STARTED,
)
from deepinfer_sched.traces.types import Trace, TraceRequest, check_chained

__all__ = ["SimResult", "Simulator"]

#: Timeline samples per trace when ``SimConfig.sample_interval_s`` is None.
DEFAULT_SAMPLES = 200


class Simulator(SimDispatch, SimIterations, SimClusterEvents):
    """Runs one trace through one configuration. Use once: ``Simulator(...).run()``."""

    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        seed: int = 0,
        cost_model: CostModel | Sequence[CostModel] | None = None,
    ) -> None:
        if len(trace) == 0:
            raise ValueError("trace has no requests: nothing to simulate")
        # Non-chained ids would break the prefix caches' binary search mid-run; fail here,
        # naming the request (loaders already name the file line).
        check_chained(trace.requests)
        self.trace = trace
        self.cfg = config
        models = self._cost_models(config, cost_model)
        cm = models[0]
        self.cm = cm
        bs = trace.block_size
        sched = config.scheduler
        policies = sched.build(cm)
        self.router = policies.router
        self.pd = policies.pd
        self.pairing = policies.pairing
        self.admission = policies.admission
        self.migration = policies.migration
        rng = np.random.default_rng(seed)
        steps_for = make_steps_for(config.spec, rng)
        verify = config.spec.gamma if config.spec is not None else 0
        self.ssd = LRUBlockCache(config.ssd_capacity_blocks) if config.ssd_capacity_blocks else None
        self.clock = SimClock()
        self.instances: list[Instance] = []
        for i in range(config.num_instances):
            if not config.disaggregated:
                role = "both"
            else:
                role = "prefill" if i < config.num_prefill else "decode"
            m = models[i]
            kv_cap = config.kv_capacity_tokens or m.kv_capacity_tokens(config.kv_memory_fraction)
            cache_blocks = (
                config.prefix_cache_blocks
                if config.prefix_cache_blocks is not None
                else kv_cap // bs
            )
            self.instances.append(
                Instance(
                    i,
                    role,
                    m,
                    policies.batch,
                    bs,
                    kv_cap,
                    cache_blocks,
                    self.ssd,
                    steps_for,
                    verify,
                    config.fast_forward,
                    self.clock,
                    cache_publish=config.cache_publish,
                )
            )
        self.fleet: Fleet | None = None
        if config.autoscale is not None:
            t0 = trace.requests[0].arrival_s
            self.fleet = Fleet(config.autoscale, self.instances, config.ttft_slo_s, t0)
        self._slo = SLO(config.ttft_slo_s, config.tpot_slo_s)
        self._waiting_first: dict[int, float] = {}
        self._refresh_pools()
        self.events: list[tuple[float, int, int, object, object, int]] = []
        self._seq = 0
        self.records: dict[int, RequestRecord] = {}
        self.result = SimResult([], {}, 0.0)
        self.outstanding = 0
        self._next_arrival = 0
        interval = config.sample_interval_s
        if interval is None:
            interval = max(trace.duration_s / DEFAULT_SAMPLES, 1e-3)
        self.sample_interval_s = interval
        self._samples: list[tuple[float, float, float, int, int]] = []

    @staticmethod
    def _cost_models(
        config: SimConfig, cost_model: CostModel | Sequence[CostModel] | None
    ) -> list[CostModel]:
        """One cost model per instance: the one given (or one per instance, for a mixed
        pool of fitted models), else a roofline per ``instance_types`` entry, else one
        roofline of ``hardware``/``model``/``num_gpus`` for all."""
        n = config.num_instances
        if cost_model is not None:
            if isinstance(cost_model, Sequence):
                if len(cost_model) != n:
                    raise ValueError(
                        f"cost_model: {len(cost_model)} models given for {n} instances"
                    )
                return list(cost_model)
            return [cost_model] * n
        out: list[CostModel] = []
        cache: dict[tuple[str, str, int], CostModel] = {}
        types = config.instance_types or (
            InstanceType(n, config.hardware, config.num_gpus, config.model),
        )
        for t in types:
            key = (t.hardware, t.model or config.model, t.num_gpus)
            if key not in cache:
                cache[key] = RooflineCostModel(
                    load_hardware(key[0]), load_model(key[1]), num_gpus=key[2]
                )
            out.extend([cache[key]] * t.count)
        return out

    # ------------------------------------------------------------------ main loop
    def run(self, progress: Callable[[int], None] | None = None) -> SimResult:
        """Simulate the whole trace; ``progress(n)`` is called with the number of requests
        finalised since the previous call, every few thousand."""
        reqs: tuple[TraceRequest, ...] = self.trace.requests
        n = len(reqs)
        for f in self.cfg.faults:
            self._push(f.time_s, _FAULT, self.instances[f.instance_id], None, 0)
        if self.migration is not None and n:
            self._push(reqs[0].arrival_s + self.migration.interval_s, _MIGRATE, None, None, 0)
        if self.sample_interval_s > 0 and n:
            self._push(reqs[0].arrival_s, _SAMPLE, None, None, 0)
        if self.fleet is not None and n:
            self._push(reqs[0].arrival_s + self.fleet.cfg.interval_s, _SCALE, None, None, 0)
        events = self.events
        pop = heapq.heappop
        self._next_arrival = 0
        n_events = 0
        reported = 0
        now = 0.0
        while True:
            i = self._next_arrival
            if i < n and (not events or reqs[i].arrival_s < events[0][0]):
                tr = reqs[i]
                now = tr.arrival_s
                self.clock.now = now
                self._next_arrival = i + 1
                self.outstanding += 1
                self._waiting_first[tr.request_id] = tr.arrival_s
                if self.fleet is not None:
                    self.fleet.arrived(now)
                self._dispatch(SimRequest(tr), now, admit=True)
            elif events:
                now, _, kind, a, b, tag = pop(events)
                self.clock.now = now
                n_events += 1
                if kind == _ITER:
                    assert isinstance(a, Instance)
                    if tag == a.version:
                        self._on_iter(a, now)
                elif kind == _KV_ARRIVE:
                    assert isinstance(a, Instance) and isinstance(b, SimRequest)
                    if tag == b.epoch:
                        self._on_kv_arrive(a, b, now)
                elif kind == _READY:
                    assert isinstance(a, Instance) and isinstance(b, SimRequest)
                    # A fault drains fetching requests too (bumping their epoch), so a
                    # current tag means the instance is alive.
                    if tag == b.epoch:
                        a.end_fetch(b)
                        self._touch(a, now)
                        a.enqueue(b)
                        if not a.busy:
                            self._start(a, now)
                elif kind == _PAIR_RETRY:
                    assert isinstance(a, Instance) and isinstance(b, SimRequest)
                    if tag == b.epoch and b.request_id in a.pending_pair:
                        del a.pending_pair[b.request_id]
                        self._pair(a, b, now)
                elif kind == _FAULT:
                    assert isinstance(a, Instance)
                    self._on_fault(a, now)
                elif kind == _SAMPLE:
                    self._on_sample(now)
                elif kind == _SCALE:
                    self._on_scale(now)
                elif kind == _STARTED:
                    assert isinstance(a, Instance) and self.fleet is not None
                    self.fleet.started(a.instance_id)
                    self._refresh_pools()
                else:
                    self._on_migrate(now)
            else:
                break
            if progress is not None and len(self.records) - reported >= 4096:
                progress(len(self.records) - reported)
                reported = len(self.records)
        if progress is not None and len(self.records) > reported:
            progress(len(self.records) - reported)
        if len(self.records) != n or self.outstanding != 0:
            raise RuntimeError(
                f"simulation ended with {n - len(self.records)} requests unaccounted for"
            )
        res = self.result
        res.records = [self.records[r.request_id] for r in reqs]
        res.instance_busy_s = {x.instance_id: x.busy_s for x in self.instances}
        if all(x._parts is not None for x in self.instances):
            res.instance_compute_s = {x.instance_id: x.compute_s for x in self.instances}
            res.instance_memory_s = {x.instance_id: x.memory_s for x in self.instances}
        res.timeline = self._timeline()
        first = reqs[0].arrival_s
        end = max(now, reqs[-1].arrival_s)
        if self.fleet is not None:
            self.fleet.close(end)
            res.instance_seconds = self.fleet.on_s
            res.fleet_size = tuple(self.fleet.log)
        else:
            # A fixed fleet is on from the first arrival to the end, or to its fault.
            died: dict[int, float] = {}
            for f in self.cfg.faults:
                died[f.instance_id] = min(died.get(f.instance_id, end), f.time_s)
            res.instance_seconds = sum(
                max(0.0, min(died.get(x.instance_id, end), end) - first) for x in self.instances
            )
        res.duration_s = max(now - first, self.trace.duration_s, 1e-9)
        res.events = n_events
        return res
