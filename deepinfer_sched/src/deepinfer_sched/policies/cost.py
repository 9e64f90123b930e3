"""Cost routing: trade prefill work against decode pressure in KV blocks."""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_sched.policies.base import InstanceView, RequestView

__all__ = ["CostRouter", "routing_cost"]


def routing_cost(request: RequestView, inst: InstanceView, prefill_weight: float) -> float:
    """``w * uncached_prefill_blocks + decode_blocks``.

    ``uncached_prefill_blocks`` = blocks already queued for prefill on the instance plus
    this request's prompt blocks the instance cannot reuse (local cache or SSD tier);
    ``decode_blocks`` = KV blocks held by running sequences.
    """
    bs = inst.block_size
    prompt_blocks = -(-request.input_len // bs)
    uncached = prompt_blocks - inst.reachable_prefix_blocks(request.block_hashes)
    queued = -(-inst.waiting_tokens // bs)
    decode_blocks = -(-inst.kv_used_tokens // bs)
    return prefill_weight * (queued + uncached) + decode_blocks


class CostRouter:
    """Lowest :func:`routing_cost` wins; ties go to the lower position in ``candidates``.

    ``prefill_weight`` is how many decode blocks one prefill block is worth; prefill is
    compute-bound and sits on the TTFT path, so values above 1 favour cache reuse.
    """

    __slots__ = ("prefill_weight",)

    def __init__(self, prefill_weight: float = 4.0) -> None:
        if not prefill_weight >= 0.0:
            raise ValueError(f"prefill_weight must be >= 0, got {prefill_weight}")
        self.prefill_weight = prefill_weight

    def route(self, request: RequestView, candidates: Sequence[InstanceView]) -> InstanceView:
        best = candidates[0]
        best_cost = routing_cost(request, best, self.prefill_weight)
        for inst in candidates[1:]:
            c = routing_cost(request, inst, self.prefill_weight)
            if c < best_cost:
                best, best_cost = inst, c
        return best
