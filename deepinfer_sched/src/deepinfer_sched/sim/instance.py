"""One serving instance: a prefix cache, a waiting queue, a running decode set.

The decode set is kept in aggregate so an iteration costs O(1) plus the sequences that
finish in it: each sequence knows the iteration at which it finishes (a min-heap), and the
instance tracks the total context and the tokens added per step. No per-token events.

``Instance`` is layered, one concept per module: ``instance_state.py`` (attributes),
``decode_stretch.py`` (fast-forwarded decode-only stretches), ``instance_signals.py`` (load
signals), ``instance_requests.py`` (requests joining and leaving); this module plans and
applies an iteration.
"""

from __future__ import annotations

import heapq

from deepinfer_sched.sim.instance_requests import InstanceRequests
from deepinfer_sched.sim.instance_state import ROLES as ROLES
from deepinfer_sched.sim.request import SimRequest
from deepinfer_sched.sim.sim_clock import SimClock

__all__ = ["Instance", "SimClock"]


class Instance(InstanceRequests):
    """A simulated replica; implements :class:`~deepinfer_sched.policies.InstanceView`."""

    __slots__ = ()

    def _preempt_one(self) -> SimRequest:
        """Lowest priority, latest arrival: the request whose recompute hurts least."""
        victim = min(self.running.values(), key=lambda r: (r.priority, -r.arrival_s))
        self.remove_running(victim)
        self.preemptions += 1
        victim.input_len = victim.prompt_len + victim.generated
        victim.computed = 0
        return victim

    def plan_iteration(self, now: float) -> tuple[float, list[SimRequest]]:
        """Choose this iteration's work starting at ``now``; returns (duration, preempted).

        Duration 0 means there is nothing to do. A request admitted to prefill reserves KV
        for its whole prompt, so partial prefills can never deadlock each other; decode
        growth beyond capacity preempts running requests, which go back to the caller to be
        requeued (their KV is gone: recompute).
        """
        cfg = self.batch
        cap = self.kv_capacity_tokens
        preempted: list[SimRequest] = []
        while self.running and self._ctx + self._tps_sum + self._prefill_kv > cap:
            preempted.append(self._preempt_one())
        b = len(self.running)
        budget = cfg.max_batched_tokens - b
        chunks = self._chunks
        t = 0.0
        cm = self.cm
        for req in self.prefilling:
            if budget <= 0:
                break
            chunk = min(req.input_len - req.computed, budget)
            chunks.append((req, chunk))
            t += cm.prefill_time(chunk, req.computed)
            budget -= chunk
        waiting = self._waiting
        free = cap - int(self._ctx + self._tps_sum) - self._prefill_kv - self.inbound_tokens
        while waiting and budget > 0:
            if b + len(self.prefilling) >= cfg.max_num_seqs:
                break
            req = waiting[0][3]
            if req.input_len > free:
                break
            if self.publish_on_finish and req.block_hashes:
                self._relookup(req)
            remaining = req.input_len - req.computed
            if cfg.chunked_prefill:
                chunk = min(remaining, budget)
            elif remaining <= budget or (not chunks and b == 0):
                chunk = remaining
            else:
                break
            heapq.heappop(waiting)
            self.prefilling.append(req)
            self._queued_kv -= req.input_len
            self._prefill_kv += req.input_len
            free -= req.input_len
            chunks.append((req, chunk))
            t += cm.prefill_time(chunk, req.computed)
            budget -= chunk
        self._steps = 1
        if b:
            bv = b * (1 + self.spec_verify)
            self._step_batch = bv
            self._ctx0 = self._ctx
            self._g = self._tps_sum
            if not chunks and self.fast_forward:
                self._steps = self._decode_only_steps()
                whole = self._span(self._steps)
                t += whole
                if self._steps > 1:
                    # Per-step time and its growth, for O(1) reads of the steps done so far.
                    self._t0 = self._span(1)
                    self._d = (whole / self._steps - self._t0) * 2.0 / (self._steps - 1)
            else:
                t += cm.decode_step_time(bv, int(self._ctx))
        terms = len(chunks) + (1 if b else 0)
        if terms > 1 and self._overhead > 0.0:
            t -= (terms - 1) * self._overhead
        self._start_s = now
        self._end_s = now + t
        if self._parts is not None and t > 0:
            self._add_parts(b > 0)
        return t, preempted

    def _relookup(self, req: SimRequest) -> None:
        """Admission-time prefix lookup: blocks published while ``req`` queued count too."""
        hit = min(self.cache.prefix_hits(req.block_hashes) * self.block_size, req.input_len - 1)
        if hit > req.computed:
            self.waiting_tokens -= hit - req.computed
            req.computed = hit
            req.cached_tokens = max(req.cached_tokens, hit)

    def _add_parts(self, decoding: bool) -> None:
        """Add the planned iteration's compute and memory seconds (see WorkParts)."""
        parts = self._parts
        assert parts is not None
        c = m = 0.0
        for req, chunk in self._chunks:
            pc, pm = parts.prefill_parts(chunk, req.computed)
            c += pc
            m += pm
        if decoding:
            pc, pm = self._span_parts(self._steps)
            c += pc
            m += pm
        self.compute_s += c
        self.memory_s += m

    def finish_iteration(self) -> tuple[list[SimRequest], list[SimRequest]]:
        """Apply the planned iteration; returns (prefills completed, decodes finished)."""
        done_prefill: list[SimRequest] = []
        for req, chunk in self._chunks:
            req.computed += chunk
            self.waiting_tokens -= chunk
            if req.computed >= req.input_len:
                self._prefill_kv -= req.input_len
                self.prefilling.remove(req)
                done_prefill.append(req)
                ends_now = req.output_len <= max(1, req.generated)
                if req.block_hashes and (not self.publish_on_finish or ends_now):
                    self.cache.insert(req.block_hashes)
                    if self.ssd is not None:
                        self.ssd.insert(req.block_hashes)
        self._chunks.clear()
        finished: list[SimRequest] = []
        if self.running:
            self.iter_count += self._steps
            it = self.iter_count
            self._ctx += self._steps * self._tps_sum
            heap = self._finish_heap
            while heap and heap[0][0] <= it:
                _, _, epoch, req = heapq.heappop(heap)
                if epoch != req.epoch or req.inst is not self:
                    continue
                self.remove_running(req)
                finished.append(req)
                if self.publish_on_finish and req.block_hashes:
                    self.cache.insert(req.block_hashes)
                    if self.ssd is not None:
                        self.ssd.insert(req.block_hashes)
        return done_prefill, finished
