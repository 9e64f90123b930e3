"""The state of one simulated instance (``Instance``): its ``__slots__`` and construction.

``Instance`` is layered over this class, one concept per module: ``decode_stretch.py`` (the
fast-forwarded decode-only stretch), ``instance_signals.py`` (the load signals routers read),
``instance_requests.py`` (requests joining and leaving) and ``instance.py`` (planning and
applying an iteration). Every layer but this one has empty ``__slots__``, so an instance
still has no ``__dict__``.
"""

from __future__ import annotations

from collections.abc import Callable

from deepinfer_sched.costmodel.base import WorkParts
from deepinfer_sched.policies.base import CostModelLike
from deepinfer_sched.policies.batch import BatchConfig
from deepinfer_sched.sim.prefix_cache import LRUBlockCache
from deepinfer_sched.sim.request import SimRequest
from deepinfer_sched.sim.sim_clock import SimClock

ROLES = ("both", "prefill", "decode")


class InstanceState:
    """Every attribute of a simulated instance, set up empty."""

    __slots__ = (
        "_chunks",
        "_ctx",
        "_ctx0",
        "_d",
        "_end_s",
        "_finish_heap",
        "_g",
        "_heap_seq",
        "_overhead",
        "_parts",
        "_prefill_kv",
        "_queued_kv",
        "_s_per_token",
        "_start_s",
        "_step_batch",
        "_steps",
        "_t0",
        "_tps_sum",
        "_waiting",
        "alive",
        "batch",
        "block_size",
        "busy",
        "busy_s",
        "cache",
        "clock",
        "cm",
        "compute_s",
        "fast_forward",
        "fetching",
        "inbound",
        "inbound_tokens",
        "instance_id",
        "iter_count",
        "kv_capacity_tokens",
        "link_free_s",
        "memory_s",
        "pending_pair",
        "preemptions",
        "prefilling",
        "publish_on_finish",
        "role",
        "running",
        "spec_verify",
        "ssd",
        "steps_for",
        "version",
        "waiting_tokens",
    )

    def __init__(
        self,
        instance_id: int,
        role: str,
        cm: CostModelLike,
        batch: BatchConfig,
        block_size: int,
        kv_capacity_tokens: int,
        cache_blocks: int,
        ssd: LRUBlockCache | None,
        steps_for: Callable[[int], int],
        spec_verify: int = 0,
        fast_forward: bool = True,
        clock: SimClock | None = None,
        cache_publish: str = "prefill",
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.instance_id = instance_id
        self.role = role
        self.cm = cm
        self.batch = batch
        self.block_size = block_size
        self.kv_capacity_tokens = kv_capacity_tokens
        self.cache = LRUBlockCache(cache_blocks)
        self.ssd = ssd
        self.steps_for = steps_for
        self.spec_verify = spec_verify
        # "finish": blocks become hits when their request ends, and a queued request looks
        # its prefix up again when admitted (see SimConfig.cache_publish).
        self.publish_on_finish = cache_publish == "finish"
        self.alive = True
        self.busy = False
        self.busy_s = 0.0
        # Seconds the work done here keeps the attainable compute / HBM bandwidth busy
        # (only when the cost model can split a step; see WorkParts).
        self.compute_s = 0.0
        self.link_free_s = 0.0
        self.memory_s = 0.0
        self._parts = cm if isinstance(cm, WorkParts) else None
        # An iteration is one forward pass: its fixed per-step cost is paid once, although
        # each prefill chunk's and the decode step's time include it.
        self._overhead = float(getattr(cm, "step_overhead_s", 0.0))
        self._t0 = 0.0
        self._d = 0.0
        self.version = 0
        self.iter_count = 0
        self.preemptions = 0
        self._waiting: list[tuple[int, float, int, SimRequest]] = []
        self._heap_seq = 0
        self.prefilling: list[SimRequest] = []
        self.waiting_tokens = 0
        self._prefill_kv = 0
        self._queued_kv = 0
        self.fetching: dict[int, SimRequest] = {}
        self.clock = clock if clock is not None else SimClock()
        self.running: dict[int, SimRequest] = {}
        self._finish_heap: list[tuple[int, int, int, SimRequest]] = []
        self._ctx = 0.0
        self._tps_sum = 0.0
        self._chunks: list[tuple[SimRequest, int]] = []
        self.inbound: dict[int, SimRequest] = {}
        self.inbound_tokens = 0
        self.pending_pair: dict[int, SimRequest] = {}
        self.fast_forward = fast_forward
        self._steps = 1
        self._start_s = 0.0
        self._end_s = 0.0
        self._ctx0 = 0.0
        self._g = 0.0
        self._step_batch = 0
        probe = 8192
        self._s_per_token = cm.prefill_time(probe, 0) / probe

    @property
    def cost_model(self) -> CostModelLike:
        """This instance's own cost model (instances of a mixed pool differ); routers that
        price work (``ttft_estimate``) use it when an instance exposes it."""
        return self.cm
