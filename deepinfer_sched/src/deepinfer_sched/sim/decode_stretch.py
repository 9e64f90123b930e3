"""The decode-only stretch of a simulated instance: several pure-decode steps run as one event.

The decode set is kept in aggregate so an iteration costs O(1) plus the sequences that finish
in it: each sequence knows the iteration at which it finishes (a min-heap), and the instance
tracks the total context and the tokens added per step. With ``fast_forward`` the steps up
to the next finish (or the KV limit) are one event, timed in closed form (``_span``); new
work arriving meanwhile cuts the stretch at the step in progress (``truncate``), and the
load signals read the steps done so far (``_steps_done``).
"""

from __future__ import annotations

import heapq
import math

from deepinfer_sched.sim.instance_state import InstanceState


class DecodeStretch(InstanceState):
    """Timing, reading and cutting short a decode-only stretch."""

    __slots__ = ()

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
