"""The load signals a simulated instance shows the routers (``InstanceView``)."""

from __future__ import annotations

from deepinfer_sched.sim.decode_stretch import DecodeStretch


class InstanceSignals(DecodeStretch):
    """Queue, KV and time signals of an instance, as of the simulator's clock."""

    __slots__ = ()

    # ------------------------------------------------------------------ InstanceView
    # Every signal counts every request this instance has accepted (queued, fetching its
    # prefix from the SSD tier, prefilling, decoding, receiving KV): a router that could not
    # see the requests still fetching would send the next ones to the same instance.
    @property
    def num_waiting(self) -> int:
        """Requests accepted but not yet decoding: queued, fetching, prefilling."""
        return len(self._waiting) + len(self.prefilling) + len(self.fetching)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def kv_used_tokens(self) -> int:
        """KV held or committed: decoding contexts (as of now), prefills in progress, KV in
        transfer here, and the prompts of queued and fetching requests."""
        return int(self.live_context()) + self._prefill_kv + self.inbound_tokens + self._queued_kv

    def kv_held_tokens(self) -> int:
        """KV resident or arriving now (no queued commitments): what occupancy reports."""
        return int(self.live_context()) + self._prefill_kv + self.inbound_tokens

    def live_context(self) -> float:
        """Total decode context at the clock's time. Inside a fast-forwarded stretch the
        aggregate is only committed at its end; the steps completed by now are added here,
        the same count :meth:`truncate` would commit, so a router sees what a step-by-step
        run would show it."""
        ctx = self._ctx
        if self._steps > 1 and self.busy:
            elapsed = self.clock.now - self._start_s
            if elapsed > 0.0:
                ctx += self._steps_done(elapsed) * self._g
        return ctx

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        return self.cache.prefix_hits(block_hashes)

    def reachable_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        local = self.cache.prefix_hits(block_hashes)
        if self.ssd is None:
            return local
        return max(local, self.ssd.prefix_hits(block_hashes))

    def decode_step_s(self) -> float:
        """Seconds of one step of the running decode batch (0 when nothing decodes)."""
        b = len(self.running)
        if not b:
            return 0.0
        return self.cm.decode_step_time(b * (1 + self.spec_verify), int(self.live_context()))

    def estimated_queue_time_s(self) -> float:
        """Seconds before a request sent here now finishes its first prefill iteration,
        excluding its own prefill: the queued uncached tokens at the measured prefill rate,
        plus one step of the running decode batch for each iteration that decode-first
        scheduling interleaves with them and with the new request's first chunk. Nonzero
        whenever anything runs, so an instance busy decoding never looks idle."""
        w = self.waiting_tokens
        t = w * self._s_per_token
        b = len(self.running)
        if b:
            budget = max(1, self.batch.max_batched_tokens - b)
            t += (-(-w // budget) + 1) * self.decode_step_s()
        return t
