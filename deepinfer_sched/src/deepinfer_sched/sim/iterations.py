"""Instance iterations in the simulator, and KV moving between instances: starting and
finishing an iteration, a finished prefill paired with a decode instance, and the KV transfer
(with per-link contention) that hands it over."""

from __future__ import annotations

from deepinfer_sched.sim.instance import Instance
from deepinfer_sched.sim.request import SimRequest
from deepinfer_sched.sim.sim_state import _ITER, _KV_ARRIVE, _PAIR_RETRY, SimState


class SimIterations(SimState):
    """Mixin of ``Simulator``: iteration and KV transfer events."""

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
