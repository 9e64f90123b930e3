"""`DraftGate`: stop drafting while drafting does not pay, and probe now and then.

The verification scheduler decides how many drafts to verify *after* the drafter has run, so a
drafter whose drafts are rarely accepted (a weak or mismatched checkpoint, a workload unlike its
training data) costs a drafter forward on every step for nothing. The gate tracks an exponential
moving average of accepted drafts per drafting row (``tau - 1``). While that average is below
the break-even point only one step in ``probe_every`` drafts, so the average keeps following the
workload and drafting resumes by itself once drafts are accepted again. Which steps draft never
changes the output distribution: a step that does not draft is a plain decode step.

Where the break-even point comes from:

* before any step is timed, ``min_accepted``: a price set in advance
  (:meth:`DraftGate.break_even` from measured parts: the drafter's forward, the target's extra
  verified token);
* once a caller passes ``seconds`` to :meth:`DraftGate.record` and :meth:`DraftGate.record_plain`
  and ``min_timed`` adjacent drafting/plain pairs are timed at a batch size, the measured one:
  a drafting step of ``B`` rows taking ``T_d`` against a plain step's ``T_p`` emits
  ``B (1 + a)`` tokens against ``B``, so it pays from ``a = T_d / T_p - 1`` accepted drafts per
  row. A price from the parts misses whatever it did not time (the speculator's context
  bookkeeping, the draft block, acceptance, verify-logits processing: ~0.6 of a plain step on
  the 2-core CPU of ``benchmarks/results/engine_spec.md``, session 13), and a drafter then drafts
  at a loss. ``T_d / T_p`` is the median of the last ``time_window`` ratios of adjacent timed
  steps of the two kinds at that batch size: adjacent steps ran under the same load, and a
  preempted step on a shared CPU (the start-up steps ran 10-50x slower in one run) moves a
  median by one rank, a mean by its whole excess.

An open timed gate keeps timing plain steps: it leaves one step in ``probe_every`` plain (one in
two while the batch size has fewer than ``min_timed`` plain steps timed).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class _StepTimes:
    """Timed steps at one batch size: the last ``T_draft / T_plain`` of adjacent pairs."""

    ratios: deque[float] = field(default_factory=deque)
    last: tuple[bool, float] | None = None  # the previous timed step: (drafted, seconds)
    num_plain: int = 0


class DraftGate:
    """Per-engine on/off switch for drafting, driven by the accepted drafts it observes.

    Args:
        min_accepted: drafting pauses while the average of accepted drafts per drafting row is
            below this (0 never pauses), until measured step times replace it.
        probe_every: while paused, every ``probe_every``-th step drafts anyway.
        decay: weight of the old average in each update, in ``[0, 1)``.
        warmup_rows: drafting rows observed before the gate may pause.
        min_timed: timed ratios (a drafting step next to a plain one) at a batch size before
            their measured break-even replaces ``min_accepted`` there.
        time_window: ratios kept per batch size (their median is used).
        max_break_even: upper bound of a measured break-even (accepted drafts per row), so a
            few slow drafting steps cannot shut the gate for good: a probe that accepts this
            many drafts still reopens it.

    Example::

        gate = DraftGate(min_accepted=0.25)
        if gate.should_draft(num_rows=4):
            ...  # propose, verify
            gate.record(num_rows=4, num_accepted=1, seconds=0.031)
        else:
            ...  # a plain step
            gate.record_plain(num_rows=4, seconds=0.016)
    """

    def __init__(
        self,
        min_accepted: float = 0.25,
        probe_every: int = 8,
        decay: float = 0.9,
        warmup_rows: int = 16,
        *,
        min_timed: int = 3,
        time_window: int = 16,
        max_break_even: float = 8.0,
    ) -> None:
        if not min_accepted >= 0:
            raise ValueError(f"min_accepted: expected a number >= 0, got {min_accepted!r}")
        if not _is_count(probe_every) or probe_every < 1:
            raise ValueError(f"probe_every: expected a positive int, got {probe_every!r}")
        if not 0 <= decay < 1:
            raise ValueError(f"decay: expected a number in [0, 1), got {decay!r}")
        if not _is_count(warmup_rows) or warmup_rows < 0:
            raise ValueError(f"warmup_rows: expected an int >= 0, got {warmup_rows!r}")
        if not _is_count(min_timed) or min_timed < 1:
            raise ValueError(f"min_timed: expected a positive int, got {min_timed!r}")
        if not _is_count(time_window) or time_window < min_timed:
            raise ValueError(
                f"time_window: expected an int >= min_timed ({min_timed}), got {time_window!r}"
            )
        finite = isinstance(max_break_even, (int, float)) and math.isfinite(max_break_even)
        if not (finite and max_break_even > 0):
            raise ValueError(
                f"max_break_even: expected a finite number > 0, got {max_break_even!r}"
            )
        self.min_accepted = float(min_accepted)
        self.probe_every = probe_every
        self.decay = float(decay)
        self.warmup_rows = warmup_rows
        self.min_timed = min_timed
        self.time_window = time_window
        self.max_break_even = float(max_break_even)
        self.mean_accepted: float | None = None  # None until a drafting row is recorded
        self.rows_seen = 0
        self.num_skipped = 0  # steps that did not draft: closed gate, or a plain timing probe
        self._since_probe = 0
        self._num_rows = 1  # the batch size of the latest step asked about or recorded
        self._times: dict[int, _StepTimes] = {}
        # Set by break_even: the accepted drafts per row at which drafting starts to pay.
        self.break_even_accepted: float | None = None

    @classmethod
    def break_even(
        cls,
        draft_s: float,
        plain_step_s: float,
        verify_extra_s: float = 0.0,
        *,
        floor: float = 0.25,
        probe_every: int = 8,
        probe_budget: float = 0.03,
        decay: float = 0.9,
        warmup_rows: int = 16,
    ) -> DraftGate:
        """A gate that pauses drafting while it does not pay on this hardware.

        A plain step costs ``plain_step_s`` and emits one token per row; a drafting step costs
        ``draft_s`` (the drafter's forward) plus ``verify_extra_s`` (the target reading the
        drafts too) more and emits ``1 + a`` tokens, ``a`` the accepted drafts. It pays when
        ``a > (draft_s + verify_extra_s) / plain_step_s``, so that ratio (at least ``floor``)
        becomes ``min_accepted``; it is kept as :attr:`break_even_accepted`. Once the caller
        times its steps, the measured break-even replaces it (see the module docstring).

        A probe costs about that ratio of a step, so probes are spaced to spend at most
        ``probe_budget`` of the time while the gate is closed: every
        ``max(probe_every, ceil(ratio / probe_budget))`` steps.
        """
        for name, value, positive in (
            ("draft_s", draft_s, False),
            ("verify_extra_s", verify_extra_s, False),
            ("floor", floor, False),
            ("plain_step_s", plain_step_s, True),
            ("probe_budget", probe_budget, True),
        ):
            finite = isinstance(value, (int, float)) and math.isfinite(value)
            if not (finite and (value > 0 if positive else value >= 0)):
                bound = "> 0" if positive else ">= 0"
                raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}")
        ratio = (draft_s + verify_extra_s) / plain_step_s
        spaced = max(probe_every, math.ceil(ratio / probe_budget))
        gate = cls(max(floor, ratio), spaced, decay, warmup_rows)
        gate.break_even_accepted = ratio
        return gate

    def measured_break_even(self, num_rows: int | None = None) -> float | None:
        """Accepted drafts per row from which drafting pays at batch size ``num_rows`` (``None``:
        the latest step's): the median ``T_draft / T_plain`` of adjacent timed steps there,
        minus 1, within ``[0, max_break_even]``; ``None`` until ``min_timed`` such ratios."""
        times = self._times.get(self._num_rows if num_rows is None else num_rows)
        if times is None or len(times.ratios) < self.min_timed:
            return None
        ratio = statistics.median(times.ratios) - 1.0
        return min(self.max_break_even, max(0.0, ratio))

    def threshold(self, num_rows: int | None = None) -> float:
        """The accepted drafts per row the gate asks for at batch size ``num_rows`` (``None``:
        the latest step's): the measured break-even once there is one, else ``min_accepted``."""
        measured = self.measured_break_even(num_rows)
        return self.min_accepted if measured is None else measured

    @property
    def is_open(self) -> bool:
        """True while drafting pays at the latest step's batch size: every step drafts, except
        that a timed gate leaves one step in ``probe_every`` plain."""
        if self.rows_seen < self.warmup_rows or self.mean_accepted is None:
            return True
        return self.mean_accepted >= self.threshold()

    def should_draft(self, num_rows: int | None = None) -> bool:
        """Whether this step drafts (call once per step that has rows able to draft;
        ``num_rows``: how many, so that the break-even measured at that batch size applies).

        While closed, every ``probe_every``-th step drafts. Once steps are timed, an open gate
        also leaves every ``probe_every``-th step plain (every other one while this batch size
        has fewer than ``min_timed`` plain steps timed), so that the plain step time it
        compares against stays measured."""
        if num_rows is not None:
            if not _is_count(num_rows) or num_rows < 1:
                raise ValueError(f"num_rows: expected a positive int, got {num_rows!r}")
            self._num_rows = num_rows
        if self.is_open:
            if not self._times:  # nothing timed: an open gate always drafts
                self._since_probe = 0
                return True
            times = self._times.get(self._num_rows)
            short = times is None or times.num_plain < self.min_timed
            self._since_probe += 1
            if self._since_probe < (2 if short else self.probe_every):
                return True
            self._since_probe = 0
            self.num_skipped += 1
            return False
        self._since_probe += 1
        if self._since_probe >= self.probe_every:
            self._since_probe = 0
            return True
        self.num_skipped += 1
        return False

    def record(self, num_rows: int, num_accepted: int, seconds: float | None = None) -> None:
        """Fold in one drafting step: ``num_rows`` rows drafted, ``num_accepted`` drafts were
        accepted over all of them (bonus tokens excluded); ``seconds``, the step's wall time,
        when the caller times its steps (pass it only for steps of decode rows alone, all of
        them drafting)."""
        if num_rows < 0 or num_accepted < 0:
            raise ValueError(
                f"num_rows and num_accepted must be >= 0, got {num_rows} and {num_accepted}"
            )
        _check_seconds(seconds)
        if num_rows == 0:
            return
        self.mean_accepted = self._average(self.mean_accepted, num_accepted / num_rows)
        self.rows_seen += num_rows
        self._num_rows = num_rows
        if seconds is not None:
            self._pair(num_rows, True, seconds)

    def record_plain(self, num_rows: int, seconds: float) -> None:
        """Fold in one timed step that did not draft: ``num_rows`` decode rows, one token each,
        in ``seconds`` (pass only steps of decode rows alone, like :meth:`record`)."""
        if num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {num_rows}")
        _check_seconds(seconds)
        if num_rows:
            self._num_rows = num_rows
            self._pair(num_rows, False, seconds)

    def _pair(self, num_rows: int, drafted: bool, seconds: float) -> None:
        """Keep ``T_draft / T_plain`` whenever a timed step follows one of the other kind at
        this batch size: adjacent steps ran under the same load, so a load change never pairs
        a plain step timed then with a drafting step timed now (an open gate times a plain step
        only every ``probe_every`` steps; separate windows went stale)."""
        times = self._times.setdefault(num_rows, _StepTimes())
        times.num_plain += not drafted
        if times.last is not None and times.last[0] != drafted:
            draft_s, plain_s = (seconds, times.last[1]) if drafted else (times.last[1], seconds)
            times.ratios.append(draft_s / plain_s)
            if len(times.ratios) > self.time_window:
                times.ratios.popleft()
        times.last = (drafted, float(seconds))

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_seconds(seconds: float | None) -> None:
    if seconds is None:
        return
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds: expected a finite number > 0, got {seconds!r}")
