"""One serving instance: a prefix cache, a waiting queue, a running decode set.

The decode set is kept in aggregate so an iteration costs O(1) plus the sequences that
finish in it: each sequence knows the iteration at which it finishes (a min-heap), and the
instance tracks the total context and the tokens added per step. No per-token events.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from deepinfer_sched.costmodel.base import WorkParts
from deepinfer_sched.policies.base import CostModelLike
from deepinfer_sched.policies.batch import BatchConfig
from deepinfer_sched.sim.prefix_cache import LRUBlockCache
from deepinfer_sched.sim.request import SimRequest

__all__ = ["Instance", "SimClock"]

ROLES = ("both", "prefill", "decode")


class SimClock:
    """The simulator's current time, shared with its instances so that a load signal read
    in the middle of a fast-forwarded decode stretch reflects the steps already done."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0


class Instance:
    """A simulated replica; implements :class:`~deepinfer_sched.policies.InstanceView`."""

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

    def _steps_done(self, elapsed: float) -> int:
        """Steps of the current stretch completed within ``elapsed`` seconds: the quadratic
        ``span(j) = j t0 + j (j - 1) d / 2`` (``t0``, ``d`` kept from the plan) solved in
        closed form with no cost-model call; only a solution within 1e-6 of a step boundary
        is checked against :meth:`_span`, so a read costs O(1) and agrees with
        :meth:`truncate`'s count."""
        last = self._steps - 1
        t0, d = self._t0, self._d
        if t0 <= 0.0 or elapsed < t0:
            return 0
        if d > 1e-15 * t0:
            a, b = d / 2.0, t0 - d / 2.0
            x = (-b + math.sqrt(b * b + 4.0 * a * elapsed)) / (2.0 * a)
        else:
            x = elapsed / t0
        j = max(0, min(last, int(x)))
        frac = x - int(x)
        if frac < 1e-6 or frac > 1.0 - 1e-6:
            while j < last and self._span(j + 1) <= elapsed:
                j += 1
            while j > 0 and self._span(j) > elapsed:
                j -= 1
        return j

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

    # ------------------------------------------------------------------ queue
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

    # ------------------------------------------------------------------ iterations
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

    def _decode_only_steps(self) -> int:
        """How many pure-decode steps can run as one event: up to the next finish, and no
        further than the KV capacity allows (so preemption decisions stay per step)."""
        heap = self._finish_heap
        while heap and (heap[0][2] != heap[0][3].epoch or heap[0][3].inst is not self):
            heapq.heappop(heap)
        k = heap[0][0] - self.iter_count if heap else 1
        g = self._tps_sum
        if g > 0:
            room = self.kv_capacity_tokens - self._ctx - self._prefill_kv - self.inbound_tokens
            k = min(k, int(room / g))
        return max(1, k)

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

    def _span_parts(self, j: int) -> tuple[float, float]:
        """(compute, memory) seconds of the first ``j`` decode steps, as :meth:`_span`."""
        parts = self._parts
        if j <= 0 or parts is None:
            return 0.0, 0.0
        b = self._step_batch
        c0, m0 = parts.decode_parts(b, int(self._ctx0))
        if j == 1:
            return c0, m0
        c1, m1 = parts.decode_parts(b, int(self._ctx0 + (j - 1) * self._g))
        return j * (c0 + c1) / 2.0, j * (m0 + m1) / 2.0

    def _span(self, j: int) -> float:
        """Seconds of the first ``j`` steps of the current decode-only stretch.

        The context grows by ``g`` tokens per step, so step ``i`` costs
        ``t(B, C0 + i g)``; the sum is the trapezoid ``j (t(B, C0) + t(B, C0 + (j - 1) g)) / 2``,
        exact when the step time is linear in the context (the memory-bound side of the
        roofline, and any fitted linear model). Both ends are whole token counts, as in a
        step-by-step run, so the two modes agree to rounding instead of drifting by half a
        token per stretch (a midpoint ``C0 + (j - 1) g / 2`` would be truncated).
        """
        if j <= 0:
            return 0.0
        t = self.cm.decode_step_time
        b = self._step_batch
        first = t(b, int(self._ctx0))
        if j == 1:
            return first
        return j * (first + t(b, int(self._ctx0 + (j - 1) * self._g))) / 2.0

    def truncate(self, now: float) -> float | None:
        """Cut a decode-only stretch short because new work arrived at ``now``.

        The steps completed by ``now`` are committed and the step in progress becomes the
        whole in-flight iteration, exactly the state a step-by-step run is in at ``now``
        (also when that step is the stretch's last: a sequence joining now must not be
        credited with the stretch's earlier steps). Returns the new end time of the
        in-flight event, or None if it is unchanged.
        """
        if self._steps <= 1:
            return None
        elapsed = now - self._start_s
        lo, hi = 0, self._steps - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if self._span(mid) <= elapsed:
                lo = mid
            else:
                hi = mid - 1
        j = lo
        last = j + 1 >= self._steps
        s_j = self._span(j)
        new_end = self._end_s if last else self._start_s + self._span(j + 1)
        if not last and self._parts is not None:
            c_all, m_all = self._span_parts(self._steps)
            c_kept, m_kept = self._span_parts(j + 1)
            self.compute_s -= c_all - c_kept
            self.memory_s -= m_all - m_kept
        self.iter_count += j
        self._ctx += j * self._tps_sum
        self._ctx0 = self._ctx
        self._start_s += s_j
        self._steps = 1
        if last:
            return None
        self.busy_s -= self._end_s - new_end
        self._end_s = new_end
        return new_end

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
