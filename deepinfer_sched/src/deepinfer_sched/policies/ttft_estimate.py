"""TTFT-estimate routing: the instance expected to emit the first token soonest."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deepinfer_sched.policies.base import CostModelLike, InstanceView, RequestView
from deepinfer_sched.policies.least_loaded import outstanding

__all__ = ["TTFTEstimateRouter", "estimate_ttft"]


def estimate_ttft(
    request: RequestView,
    inst: InstanceView,
    cost_model: CostModelLike,
    transfer_to_decode: bool = False,
) -> float:
    """Predicted time to first token if ``request`` is prefilled on ``inst``.

    ``queue + ssd_fetch(reachable - local blocks) + prefill(uncached, cached)
    [+ kv_transfer(input_len) when the KV then moves to a decode instance]``, where
    ``queue`` is ``inst.estimated_queue_time_s()`` (it prices the running decode batch too).
    """
    # An instance of a mixed pool may carry its own cost model (the simulator's do).
    cost_model = getattr(inst, "cost_model", None) or cost_model
    bs = inst.block_size
    hashes = request.block_hashes
    local = inst.cached_prefix_blocks(hashes)
    reachable = max(local, inst.reachable_prefix_blocks(hashes))
    cached = min(reachable * bs, request.input_len)
    t = inst.estimated_queue_time_s()
    if reachable > local:
        t += cost_model.ssd_fetch_time((reachable - local) * bs)
    t += cost_model.prefill_time(request.input_len - cached, cached)
    if transfer_to_decode:
        t += cost_model.kv_transfer_time(request.input_len)
    return t


class TTFTEstimateRouter:
    """Lowest :func:`estimate_ttft` wins.

    Estimates within ``rel_tol`` of the best are ties: the least loaded of them wins
    (outstanding requests, then KV used), and a remaining tie is broken by a generator
    seeded with ``seed``, so a burst of unrelated prompts spreads over idle instances instead
    of landing on the first one while the run stays a pure function of the seed.
    """

    __slots__ = ("_rng", "cost_model", "rel_tol", "transfer_to_decode")

    def __init__(
        self,
        cost_model: CostModelLike,
        transfer_to_decode: bool = False,
        seed: int = 0,
        rel_tol: float = 1e-9,
    ) -> None:
        if not rel_tol >= 0.0:
            raise ValueError(f"rel_tol must be >= 0, got {rel_tol}")
        self.cost_model = cost_model
        self.transfer_to_decode = transfer_to_decode
        self.rel_tol = rel_tol
        self._rng = np.random.default_rng(seed)

    def route(self, request: RequestView, candidates: Sequence[InstanceView]) -> InstanceView:
        cm, tr = self.cost_model, self.transfer_to_decode
        times = [estimate_ttft(request, inst, cm, tr) for inst in candidates]
        limit = min(times) * (1.0 + self.rel_tol)
        tied = [inst for inst, t in zip(candidates, times, strict=True) if t <= limit]
        if len(tied) == 1:
            return tied[0]
        keys = [(outstanding(x), x.kv_used_tokens) for x in tied]
        low = min(keys)
        tied = [x for x, k in zip(tied, keys, strict=True) if k == low]
        if len(tied) == 1:
            return tied[0]
        return tied[int(self._rng.integers(len(tied)))]
