"""Which instances are switched on: the simulator's side of autoscaling.

Keeps the serving set, instance-seconds and the window of finished requests the
:class:`~deepinfer_sched.policies.autoscale.SLOAutoscaler` judges. The event loop asks it
which instances may take new requests, tells it about finished requests, and applies its
decisions (starting instances after their start-up delay, draining removed ones).
"""

from __future__ import annotations

from collections import deque

from deepinfer_sched.policies.autoscale import AutoscaleConfig, SLOAutoscaler
from deepinfer_sched.sim.instance import Instance
from deepinfer_sched.sim.prefix_cache import LRUBlockCache

__all__ = ["Fleet"]


class Fleet:
    """On/off state of a pool of identical instances under an autoscaler."""

    def __init__(
        self, cfg: AutoscaleConfig, instances: list[Instance], ttft_slo_s: float, t0: float
    ) -> None:
        n = len(instances)
        self.cfg = cfg
        self.scaler = SLOAutoscaler(cfg, n, ttft_slo_s)
        initial = cfg.initial if cfg.initial is not None else self.scaler.max_instances
        initial = min(initial, n)
        self.instances = instances
        self.routable: set[int] = set(range(initial))
        self.starting: set[int] = set()
        self.draining: set[int] = set()
        self._on_since: dict[int, float] = dict.fromkeys(range(initial), t0)
        self.on_s = 0.0
        self._window: deque[tuple[float, bool]] = deque()
        self._arrivals: deque[float] = deque()
        self._met = 0
        self.log: list[tuple[float, int]] = [(t0, initial)]

    @property
    def active(self) -> int:
        """Instances switched on and not being removed (serving or starting)."""
        return len(self.routable) + len(self.starting)

    def arrived(self, t: float) -> None:
        self._arrivals.append(t)

    def finished(self, t: float, met: bool) -> None:
        self._window.append((t, met))
        self._met += met

    def decide(self, now: float, oldest_wait_s: float) -> int:
        """Trim the window to the last ``window_s`` and ask the autoscaler."""
        start = now - self.cfg.window_s
        w = self._window
        while w and w[0][0] < start:
            self._met -= w.popleft()[1]
        a = self._arrivals
        while a and a[0] < start:
            a.popleft()
        rate = len(a) / self.cfg.window_s
        return self.scaler.decide(now, self._met, len(w), oldest_wait_s, self.active, rate)

    def add(self, now: float) -> tuple[int, bool]:
        """Bring one instance in: a draining one back at once (returns (id, True)), else
        switch an off one on, serving after ``startup_s`` (returns (id, False)); its
        prefix cache starts cold. Returns (-1, False) when none is left."""
        if self.draining:
            i = min(self.draining)
            self.draining.discard(i)
            self.routable.add(i)
            return i, True
        for inst in self.instances:
            i = inst.instance_id
            if inst.alive and i not in self._on_since:
                self._on_since[i] = now
                self.starting.add(i)
                inst.cache = LRUBlockCache(inst.cache.capacity)
                return i, False
        return -1, False

    def started(self, i: int) -> None:
        if i in self.starting:
            self.starting.discard(i)
            self.routable.add(i)

    def remove(self) -> Instance | None:
        """Stop routing to the least loaded serving instance; it drains, then goes off."""
        cands = [x for x in self.instances if x.instance_id in self.routable and x.alive]
        if len(cands) <= 1:
            return None
        victim = min(cands, key=lambda x: (x.num_waiting + x.num_running, -x.instance_id))
        self.routable.discard(victim.instance_id)
        self.draining.add(victim.instance_id)
        return victim

    def maybe_off(self, inst: Instance, now: float) -> None:
        """Switch a draining instance off once it holds nothing."""
        i = inst.instance_id
        if i in self.draining and not inst.busy and _empty(inst):
            self.draining.discard(i)
            self.on_s += now - self._on_since.pop(i)

    def record(self, now: float) -> None:
        self.log.append((now, self.active))

    def close(self, now: float) -> None:
        """End of run: count every instance still on up to ``now``."""
        for since in self._on_since.values():
            self.on_s += max(0.0, now - since)
        self._on_since.clear()


def _empty(inst: Instance) -> bool:
    return (
        inst.num_waiting == 0
        and not inst.running
        and not inst.inbound
        and not inst.pending_pair
        and not inst.fetching
    )
