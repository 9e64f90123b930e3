"""The discrete-event loop: arrivals, instance iterations, KV transfers, faults, migration.

One heap of timestamped events (ties broken by insertion order, so a seed fixes the whole
run). Arrivals are merged from the sorted trace instead of being pushed, and each instance
has at most one iteration event in flight, so the heap stays small.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from deepinfer_sched.costmodel import CostModel, RooflineCostModel, load_hardware, load_model
from deepinfer_sched.policies.ttft_estimate import estimate_ttft
from deepinfer_sched.report import SLO, Report, RequestRecord, Timeline, build_report
from deepinfer_sched.sim.acceptance import make_steps_for
from deepinfer_sched.sim.config import InstanceType, SimConfig
from deepinfer_sched.sim.fleet import Fleet
from deepinfer_sched.sim.instance import Instance, SimClock
from deepinfer_sched.sim.prefix_cache import LRUBlockCache
from deepinfer_sched.sim.request import SimRequest
from deepinfer_sched.traces.types import Trace, TraceRequest, check_chained

__all__ = ["SimResult", "Simulator"]

_ITER, _READY, _KV_ARRIVE, _PAIR_RETRY, _FAULT, _MIGRATE, _SAMPLE, _SCALE, _STARTED = range(9)

#: Timeline samples per trace when ``SimConfig.sample_interval_s`` is None.
DEFAULT_SAMPLES = 200


@dataclass
class SimResult:
    """Raw outcome of a run: one record per request plus counters."""

    records: list[RequestRecord]
    instance_busy_s: dict[int, float]
    duration_s: float
    rejections: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    migrations: int = 0
    rerouted: int = 0
    events: int = 0
    instance_compute_s: dict[int, float] | None = None
    instance_memory_s: dict[int, float] | None = None
    timeline: Timeline | None = None
    instance_seconds: float = 0.0
    fleet_size: tuple[tuple[float, int], ...] = ()

    def report(self, slo: SLO, hit_price: float, miss_price: float) -> Report:
        """Summarise with :func:`deepinfer_sched.report.build_report`."""
        return build_report(
            self.records,
            slo,
            self.instance_busy_s,
            self.duration_s,
            hit_price,
            miss_price,
            instance_compute_s=self.instance_compute_s,
            instance_memory_s=self.instance_memory_s,
            timeline=self.timeline,
        )

    def stats(self) -> dict[str, object]:
        """Simulator counters as a JSON-ready dict."""
        return {
            "rejections": dict(sorted(self.rejections.items())),
            "preemptions": self.preemptions,
            "migrations": self.migrations,
            "rerouted": self.rerouted,
            "events": self.events,
            "instance_hours": self.instance_seconds / 3600.0,
        }


class Simulator:
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

    # ------------------------------------------------------------------ helpers
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

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self, r: SimRequest, now: float, admit: bool) -> None:
        local = True
        inst: Instance
        if not self.cfg.disaggregated:
            cands = self.pool_both
            if not cands:
                self._reject(r, "no_instance")
                return
            inst = self._route(r, cands)
        else:
            dec = self.pool_decode
            if not dec:
                self._reject(r, "no_instance")
                return
            chosen: Instance | None = None
            if self.pd.prefill_on_decode(0):
                d = self._decode_with_reuse(r, dec)
                if d is not None:
                    hit = d.reachable_prefix_blocks(r.block_hashes) * d.block_size
                    if self.pd.prefill_on_decode(max(0, r.input_len - hit)):
                        chosen = d
            if chosen is None:
                if self.pool_prefill:
                    chosen = self._route(r, self.pool_prefill)
                    local = False
                else:
                    chosen = self._route(r, dec)
            inst = chosen
        if admit and self.admission:
            transfer = not local

            def predicted() -> float:
                return estimate_ttft(r, inst, inst.cm, transfer)

            for pol in self.admission:
                reason = pol.check(r, now, predicted)
                if reason is not None:
                    self._reject(r, reason)
                    return
        if r.input_len + r.output_len > inst.kv_capacity_tokens:
            self._reject(r, "too_long")
            return
        self._enqueue(inst, r, now, kick=True)

    def _decode_with_reuse(self, r: SimRequest, dec: list[Instance]) -> Instance | None:
        """The decode instance a local prefill would use: the most reusable prefix blocks
        among those the pairing policy accepts for this request's KV (the pairing policy's
        own choice on a tie), so a follow-up turn finds the instance holding its history."""
        need = r.input_len + r.output_len
        first = self.pairing.pick(r, dec, need)
        if first is None:
            return None
        assert isinstance(first, Instance)
        best, best_hit = first, first.reachable_prefix_blocks(r.block_hashes)
        for d in dec:
            if d is first:
                continue
            hit = d.reachable_prefix_blocks(r.block_hashes)
            if hit > best_hit and self.pairing.pick(r, [d], need) is d:
                best, best_hit = d, hit
        return best

    def _route(self, r: SimRequest, cands: list[Instance]) -> Instance:
        chosen = self.router.route(r, cands)
        assert isinstance(chosen, Instance)
        return chosen

    def _enqueue(self, inst: Instance, r: SimRequest, now: float, kick: bool) -> None:
        bs = inst.block_size
        hashes = r.block_hashes
        local = inst.cache.prefix_hits(hashes)
        reach = local
        if self.ssd is not None:
            reach = max(local, self.ssd.prefix_hits(hashes))
        # At least one token is always computed: the first output needs fresh logits.
        cached = max(0, min(reach * bs, r.input_len - 1))
        if r.cached_tokens < 0:
            r.cached_tokens = cached
        r.computed = cached
        r.prefill_instance = inst.instance_id
        r.inst = inst
        if reach > local:
            fetch = inst.cm.ssd_fetch_time((reach - local) * bs)
            inst.begin_fetch(r)
            self._push(self._link(now, fetch, inst, None), _READY, inst, r, r.epoch)
            return
        self._touch(inst, now)
        inst.enqueue(r)
        if kick and not inst.busy:
            self._start(inst, now)

    # ------------------------------------------------------------------ iterations
    def _touch(self, inst: Instance, now: float) -> None:
        """Before changing a busy instance, end its decode-only stretch at the step now
        in progress (its event is replaced by one at that step's end)."""
        if inst.busy:
            end = inst.truncate(now)
            if end is not None:
                inst.version += 1
                self._push(end, _ITER, inst, None, inst.version)

    def _start(self, inst: Instance, now: float) -> None:
        dur, preempted = inst.plan_iteration(now)
        while preempted:
            self.result.preemptions += len(preempted)
            for p in preempted:
                self._enqueue(inst, p, now, kick=False)
            if dur > 0:
                break
            dur, preempted = inst.plan_iteration(now)
        if dur > 0:
            inst.busy = True
            inst.busy_s += dur
            self._push(now + dur, _ITER, inst, None, inst.version)
        else:
            inst.busy = False

    def _on_iter(self, inst: Instance, now: float) -> None:
        inst.busy = False
        done_prefill, finished = inst.finish_iteration()
        for r in finished:
            self._complete(r, now)
        for r in done_prefill:
            self._on_prefilled(inst, r, now)
        self._start(inst, now)
        if self.fleet is not None and inst.instance_id in self.fleet.draining:
            self.fleet.maybe_off(inst, now)

    def _on_prefilled(self, inst: Instance, r: SimRequest, now: float) -> None:
        r.inst = None
        if r.first_token_s < 0:
            r.first_token_s = now
            self._waiting_first.pop(r.request_id, None)
        if r.generated == 0:
            r.generated = 1
        if r.generated >= r.output_len:
            r.decode_instance = inst.instance_id
            self._complete(r, now)
            return
        if inst.role != "prefill":
            inst.join_decode(r)
            return
        self._pair(inst, r, now)

    def _pair(self, src: Instance, r: SimRequest, now: float) -> None:
        dec = self.pool_decode
        if not dec:
            self._reject(r, "no_instance")
            return
        dst = self.pairing.pick(r, dec, r.prompt_len + r.output_len)
        if dst is None:
            src.pending_pair[r.request_id] = r
            r.inst = src
            self._push(now + self.cfg.pair_retry_s, _PAIR_RETRY, src, r, r.epoch)
            return
        assert isinstance(dst, Instance)
        self._send(dst, r, now, src)

    def _link(self, now: float, seconds: float, dst: Instance, src: Instance | None) -> float:
        """When a KV transfer or SSD read of ``seconds`` (uncontended) into ``dst`` ends.

        With ``link_contention`` each instance's link carries one transfer at a time, in
        arrival order (FIFO sharing of its bandwidth): KV received from a prefill instance
        or a migration and prefixes read from the SSD tier queue behind each other, and a
        sender's link is busy while it sends.
        """
        if not self.cfg.link_contention or seconds <= 0.0:
            return now + seconds
        start = max(now, dst.link_free_s, src.link_free_s if src is not None else now)
        end = start + seconds
        dst.link_free_s = end
        if src is not None:
            src.link_free_s = end
        return end

    def _send(self, dst: Instance, r: SimRequest, now: float, src: Instance | None = None) -> None:
        tokens = r.prompt_len + r.generated
        dst.inbound[r.request_id] = r
        dst.inbound_tokens += tokens
        r.inst = dst
        seconds = (src.cm if src is not None else dst.cm).kv_transfer_time(tokens)
        self._push(self._link(now, seconds, dst, src), _KV_ARRIVE, dst, r, r.epoch)

    def _on_kv_arrive(self, dst: Instance, r: SimRequest, now: float) -> None:
        del dst.inbound[r.request_id]
        dst.inbound_tokens -= r.prompt_len + r.generated
        # The received prompt KV is now resident here: later turns of the conversation
        # can reuse it (per_request PD prefills them locally when little is left).
        if r.block_hashes:
            dst.cache.insert(r.block_hashes)
        self._touch(dst, now)
        if dst.join_decode(r):
            if not dst.busy:
                self._start(dst, now)
        else:
            self._complete(r, now)

    # ------------------------------------------------------------------ faults, migration
    def _on_fault(self, inst: Instance, now: float) -> None:
        if not inst.alive:
            return
        inst.alive = False
        inst.busy = False
        inst.version += 1
        self._refresh_pools()
        for r in inst.drain():
            self.result.rerouted += 1
            r.input_len = max(1, r.prompt_len + r.generated)
            r.computed = 0
            self._dispatch(r, now, admit=False)

    def _on_migrate(self, now: float) -> None:
        mig = self.migration
        assert mig is not None
        by_id = {x.instance_id: x for x in self.pool_decoders}
        for mv in mig.plan(self.pool_decoders):
            src, dst = by_id[mv.src], by_id[mv.dst]
            moved = 0
            for r in reversed(list(src.running.values())):
                # Whole sequences, never more than planned: overshooting could leave the
                # destination the most loaded, and a lone long sequence would then bounce
                # between two instances every interval without ever decoding.
                self._touch(src, now)
                size = r.prompt_len + r.generated_by(src.iter_count)
                if moved + size > mv.kv_tokens:
                    continue
                src.remove_running(r)
                moved += size
                self.result.migrations += 1
                self._send(dst, r, now, src)
        if self.outstanding > 0 or self._next_arrival < len(self.trace):
            self._push(now + mig.interval_s, _MIGRATE, None, None, 0)

    def _on_scale(self, now: float) -> None:
        fleet = self.fleet
        assert fleet is not None
        wf = self._waiting_first
        oldest = now - next(iter(wf.values())) if wf else 0.0
        delta = fleet.decide(now, oldest)
        for _ in range(max(0, delta)):
            i, ready = fleet.add(now)
            if i < 0:
                break
            if not ready:
                self._push(now + fleet.cfg.startup_s, _STARTED, self.instances[i], None, 0)
        if delta < 0:
            victim = fleet.remove()
            if victim is not None:
                fleet.maybe_off(victim, now)
        if delta:
            self._refresh_pools()
            fleet.record(now)
        if self.outstanding > 0 or self._next_arrival < len(self.trace):
            self._push(now + fleet.cfg.interval_s, _SCALE, None, None, 0)

    def _on_sample(self, now: float) -> None:
        occ: list[float] = []
        depth: list[int] = []
        for x in self.instances:
            if x.alive:
                occ.append(x.kv_held_tokens() / x.kv_capacity_tokens)
                depth.append(x.num_waiting)
        if occ:
            self._samples.append((now, sum(occ) / len(occ), max(occ), sum(depth), max(depth)))
        if self.outstanding > 0 or self._next_arrival < len(self.trace):
            self._push(now + self.sample_interval_s, _SAMPLE, None, None, 0)

    def _timeline(self) -> Timeline:
        cols = list(zip(*self._samples, strict=True)) if self._samples else [()] * 5
        return Timeline(
            tuple(float(v) for v in cols[0]),
            tuple(float(v) for v in cols[1]),
            tuple(float(v) for v in cols[2]),
            tuple(int(v) for v in cols[3]),
            tuple(int(v) for v in cols[4]),
        )

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
