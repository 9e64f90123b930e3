"""The simulator's mutable per-request state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepinfer_sched.traces.types import TraceRequest

if TYPE_CHECKING:
    from deepinfer_sched.sim.instance_state import InstanceState

__all__ = ["SimRequest"]


class SimRequest:
    """One request moving through the cluster.

    ``input_len`` is the number of tokens the current (re-)prefill must produce KV for:
    the prompt at first, prompt + generated tokens after a preemption, a migration failure
    or a fault (recompute). ``prompt_len`` stays the original prompt length. ``epoch`` is
    bumped whenever the request leaves an instance, which invalidates stale heap entries.
    """

    __slots__ = (
        "arrival_s",
        "base_ctx",
        "block_hashes",
        "cached_tokens",
        "computed",
        "decode_instance",
        "epoch",
        "finish_iter",
        "finish_s",
        "first_token_s",
        "gen_at_join",
        "generated",
        "input_len",
        "inst",
        "output_len",
        "prefill_instance",
        "priority",
        "prompt_len",
        "request_id",
        "start_iter",
        "tenant",
        "tps",
    )

    def __init__(self, r: TraceRequest) -> None:
        self.request_id = r.request_id
        self.arrival_s = r.arrival_s
        self.prompt_len = r.input_len
        self.input_len = max(1, r.input_len)
        self.output_len = r.output_len
        self.block_hashes = r.block_hashes
        self.tenant = r.tenant
        self.priority = r.priority
        self.computed = 0
        self.cached_tokens = -1
        self.generated = 0
        self.first_token_s = -1.0
        self.finish_s = -1.0
        self.prefill_instance = -1
        self.decode_instance = -1
        self.epoch = 0
        self.inst: InstanceState | None = None
        self.gen_at_join = 0
        self.start_iter = 0
        self.finish_iter = 0
        self.tps = 0.0
        self.base_ctx = 0

    def generated_by(self, iter_count: int) -> int:
        """Tokens generated so far while decoding on an instance at ``iter_count``."""
        done = min(iter_count, self.finish_iter) - self.start_iter
        return min(self.output_len, self.gen_at_join + int(done * self.tps))

    def ctx_at(self, iter_count: int) -> float:
        """KV tokens held while decoding (the instance's aggregate uses the same formula)."""
        done = min(iter_count, self.finish_iter) - self.start_iter
        return self.base_ctx + done * self.tps
