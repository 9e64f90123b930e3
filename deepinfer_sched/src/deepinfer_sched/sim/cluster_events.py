"""Cluster-level events in the simulator: instance faults (their requests rerouted),
periodic migration of decoding sequences, autoscaling decisions, and the occupancy samples of
the run's timeline."""

from __future__ import annotations

from deepinfer_sched.report import Timeline
from deepinfer_sched.sim.instance import Instance
from deepinfer_sched.sim.sim_state import _MIGRATE, _SAMPLE, _SCALE, _STARTED, SimState


class SimClusterEvents(SimState):
    """Mixin of ``Simulator``: fault, migration, scaling and sampling events."""

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
