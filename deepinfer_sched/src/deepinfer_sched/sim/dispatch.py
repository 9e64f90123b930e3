"""Where a request goes in the simulator: admission, routing, the PD choice of a prefill
instance (local prefill on a decoder that holds its prefix, or a prefill instance), and
enqueueing it there (after an SSD prefix fetch when that tier holds more of it)."""

from __future__ import annotations

from deepinfer_sched.policies.ttft_estimate import estimate_ttft
from deepinfer_sched.sim.instance import Instance
from deepinfer_sched.sim.request import SimRequest
from deepinfer_sched.sim.sim_state import _READY, SimState


class SimDispatch(SimState):
    """Mixin of ``Simulator``: dispatching requests to instances."""

    def _dispatch(self, r: SimRequest, now: float, admit: bool) -> None:
        local = True
        inst: Instance
        if not self.cfg.disaggregated:
            cands = self.pool_both
            if not cands:
                self._reject(r, "no_instance")
                return
            inst = self._route(r, cands)
        else:
            dec = self.pool_decode
            if not dec:
                self._reject(r, "no_instance")
                return
            chosen: Instance | None = None
            if self.pd.prefill_on_decode(0):
                d = self._decode_with_reuse(r, dec)
                if d is not None:
                    hit = d.reachable_prefix_blocks(r.block_hashes) * d.block_size
                    if self.pd.prefill_on_decode(max(0, r.input_len - hit)):
                        chosen = d
            if chosen is None:
                if self.pool_prefill:
                    chosen = self._route(r, self.pool_prefill)
                    local = False
                else:
                    chosen = self._route(r, dec)
            inst = chosen
        if admit and self.admission:
            transfer = not local

            def predicted() -> float:
                return estimate_ttft(r, inst, inst.cm, transfer)

            for pol in self.admission:
                reason = pol.check(r, now, predicted)
                if reason is not None:
                    self._reject(r, reason)
                    return
        if r.input_len + r.output_len > inst.kv_capacity_tokens:
            self._reject(r, "too_long")
            return
        self._enqueue(inst, r, now, kick=True)

    def _decode_with_reuse(self, r: SimRequest, dec: list[Instance]) -> Instance | None:
        """The decode instance a local prefill would use: the most reusable prefix blocks
        among those the pairing policy accepts for this request's KV (the pairing policy's
        own choice on a tie), so a follow-up turn finds the instance holding its history."""
        need = r.input_len + r.output_len
        first = self.pairing.pick(r, dec, need)
        if first is None:
            return None
        assert isinstance(first, Instance)
        best, best_hit = first, first.reachable_prefix_blocks(r.block_hashes)
        for d in dec:
            if d is first:
                continue
            hit = d.reachable_prefix_blocks(r.block_hashes)
            if hit > best_hit and self.pairing.pick(r, [d], need) is d:
                best, best_hit = d, hit
        return best

    def _route(self, r: SimRequest, cands: list[Instance]) -> Instance:
        chosen = self.router.route(r, cands)
        assert isinstance(chosen, Instance)
        return chosen

    def _enqueue(self, inst: Instance, r: SimRequest, now: float, kick: bool) -> None:
        bs = inst.block_size
        hashes = r.block_hashes
        local = inst.cache.prefix_hits(hashes)
        reach = local
        if self.ssd is not None:
            reach = max(local, self.ssd.prefix_hits(hashes))
        # At least one token is always computed: the first output needs fresh logits.
        cached = max(0, min(reach * bs, r.input_len - 1))
        if r.cached_tokens < 0:
            r.cached_tokens = cached
        r.computed = cached
        r.prefill_instance = inst.instance_id
        r.inst = inst
        if reach > local:
            fetch = inst.cm.ssd_fetch_time((reach - local) * bs)
            inst.begin_fetch(r)
            self._push(self._link(now, fetch, inst, None), _READY, inst, r, r.epoch)
            return
        self._touch(inst, now)
        inst.enqueue(r)
        if kick and not inst.busy:
            self._start(inst, now)
