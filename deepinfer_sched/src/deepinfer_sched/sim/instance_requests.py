"""Requests joining and leaving a simulated instance: queued, fetching a prefix from the SSD
tier, decoding, taken off (migration, preemption), or all drained when it dies."""

from __future__ import annotations

import heapq

from deepinfer_sched.sim.instance_signals import InstanceSignals
from deepinfer_sched.sim.request import SimRequest


class InstanceRequests(InstanceSignals):
    """Moves requests into and out of an instance's queue, fetching set and decode set."""

    __slots__ = ()

    def enqueue(self, req: SimRequest) -> None:
        """Queue a request whose ``computed`` already counts its cached prefix."""
        req.inst = self
        self._heap_seq += 1
        heapq.heappush(self._waiting, (-req.priority, req.arrival_s, self._heap_seq, req))
        self.waiting_tokens += req.input_len - req.computed
        self._queued_kv += req.input_len

    def begin_fetch(self, req: SimRequest) -> None:
        """``req`` waits here for its prefix to arrive from the SSD tier; it already counts
        in every load signal (as a queued request)."""
        req.inst = self
        self.fetching[req.request_id] = req
        self.waiting_tokens += req.input_len - req.computed
        self._queued_kv += req.input_len

    def end_fetch(self, req: SimRequest) -> None:
        """The fetch is done: take ``req`` out of the fetching set (the caller queues it)."""
        del self.fetching[req.request_id]
        self.waiting_tokens -= req.input_len - req.computed
        self._queued_kv -= req.input_len

    def join_decode(self, req: SimRequest) -> bool:
        """Start decoding ``req`` here; False when it has nothing left to generate."""
        remaining = req.output_len - req.generated
        if remaining <= 0:
            return False
        steps = self.steps_for(remaining)
        req.inst = self
        req.decode_instance = self.instance_id
        req.gen_at_join = req.generated
        req.start_iter = self.iter_count
        req.finish_iter = self.iter_count + steps
        req.tps = remaining / steps
        req.base_ctx = req.prompt_len + req.generated
        self.running[req.request_id] = req
        self._ctx += req.base_ctx
        self._tps_sum += req.tps
        self._heap_seq += 1
        heapq.heappush(self._finish_heap, (req.finish_iter, self._heap_seq, req.epoch, req))
        return True

    def remove_running(self, req: SimRequest) -> None:
        """Take a decoding request off this instance (migration, preemption, fault)."""
        it = self.iter_count
        req.generated = req.generated_by(it)
        self._ctx -= req.ctx_at(it)
        self._tps_sum -= req.tps
        del self.running[req.request_id]
        if not self.running:
            self._ctx = 0.0
            self._tps_sum = 0.0
        req.epoch += 1
        req.inst = None

    def drain(self) -> list[SimRequest]:
        """Everything this instance holds, detached (used when it dies)."""
        out = [e[3] for e in sorted(self._waiting)]
        out.extend(self.prefilling)
        for req in list(self.running.values()):
            self.remove_running(req)
            out.append(req)
        out.extend(self.inbound.values())
        out.extend(self.pending_pair.values())
        out.extend(self.fetching.values())
        self._waiting.clear()
        self.fetching.clear()
        self.prefilling.clear()
        self._finish_heap.clear()
        self._chunks.clear()
        self.inbound.clear()
        self.pending_pair.clear()
        self.waiting_tokens = self._prefill_kv = self.inbound_tokens = self._queued_kv = 0
        for req in out:
            req.epoch += 1
            req.inst = None
        return out
