"""TTFT-estimate routing: the instance expected to emit the first token soonest."""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_sched.policies.base import CostModelLike, InstanceView, RequestView

__all__ = ["TTFTEstimateRouter", "estimate_ttft"]


def estimate_ttft(
    request: RequestView,
    inst: InstanceView,
    cost_model: CostModelLike,
    transfer_to_decode: bool = False,
) -> float:
    """Predicted time to first token if ``request`` is prefilled on ``inst``.

    ``queue + ssd_fetch(reachable - local blocks) + prefill(uncached, cached)
    [+ kv_transfer(input_len) when the KV then moves to a decode instance]``.
    """
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
    """Lowest :func:`estimate_ttft` wins; ties go to the lower position in ``candidates``."""

    __slots__ = ("cost_model", "transfer_to_decode")

    def __init__(self, cost_model: CostModelLike, transfer_to_decode: bool = False) -> None:
        self.cost_model = cost_model
        self.transfer_to_decode = transfer_to_decode

    def route(self, request: RequestView, candidates: Sequence[InstanceView]) -> InstanceView:
        cm, tr = self.cost_model, self.transfer_to_decode
        best = candidates[0]
        best_t = estimate_ttft(request, best, cm, tr)
        for inst in candidates[1:]:
            t = estimate_ttft(request, inst, cm, tr)
            if t < best_t:
                best, best_t = inst, t
        return best
