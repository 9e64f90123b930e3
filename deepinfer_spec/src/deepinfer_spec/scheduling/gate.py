"""`DraftGate`: stop drafting while drafting does not pay, and probe now and then.

The verification scheduler decides how many drafts to verify *after* the drafter has run, so a
drafter whose drafts are rarely accepted (a weak or mismatched checkpoint, a workload unlike its
training data) costs a drafter forward on every step for nothing. The gate tracks an exponential
moving average of accepted drafts per drafting row (``tau - 1``). While that average is below
``min_accepted`` only one step in ``probe_every`` drafts, so the average keeps following the
workload and drafting resumes by itself once drafts are accepted again. Which steps draft never
changes the output distribution: a step that does not draft is a plain decode step.
:meth:`DraftGate.break_even` sets ``min_accepted`` from measured costs: where the drafter's
forward is expensive next to a target step (a CPU), drafts must be accepted more often to pay.

A price set in advance misses costs it did not time (verification, bookkeeping), and a drafter
near its break-even point then drafts at a loss. A caller that times its steps passes
``seconds`` to :meth:`DraftGate.record` and :meth:`DraftGate.record_plain`: once both kinds of
step have been timed, the gate compares the measured throughputs, tokens per second while
drafting against tokens per second without, and ignores ``min_accepted``.
"""

from __future__ import annotations

import math


class DraftGate:
    """Per-engine on/off switch for drafting, driven by the accepted drafts it observes.

    Args:
        min_accepted: drafting pauses while the average of accepted drafts per drafting row is
            below this (0 never pauses).
        probe_every: while paused, every ``probe_every``-th step drafts anyway.
        decay: weight of the old average in each update, in ``[0, 1)``.
        warmup_rows: drafting rows observed before the gate may pause.

    Example::

        gate = DraftGate(min_accepted=0.25)
        if gate.should_draft():
            ...  # propose, verify
            gate.record(num_rows=4, num_accepted=1)
    """

    def __init__(
        self,
        min_accepted: float = 0.25,
        probe_every: int = 8,
        decay: float = 0.9,
        warmup_rows: int = 16,
    ) -> None:
        if not min_accepted >= 0:
            raise ValueError(f"min_accepted: expected a number >= 0, got {min_accepted!r}")
        if not isinstance(probe_every, int) or isinstance(probe_every, bool) or probe_every < 1:
            raise ValueError(f"probe_every: expected a positive int, got {probe_every!r}")
        if not 0 <= decay < 1:
            raise ValueError(f"decay: expected a number in [0, 1), got {decay!r}")
        if not isinstance(warmup_rows, int) or isinstance(warmup_rows, bool) or warmup_rows < 0:
            raise ValueError(f"warmup_rows: expected an int >= 0, got {warmup_rows!r}")
        self.min_accepted = float(min_accepted)
        self.probe_every = probe_every
        self.decay = float(decay)
        self.warmup_rows = warmup_rows
        self.mean_accepted: float | None = None  # None until a drafting row is recorded
        # Measured seconds per emitted token, drafting and plain steps (None until timed).
        self.draft_s_per_token: float | None = None
        self.plain_s_per_token: float | None = None
        self.rows_seen = 0
        self.num_skipped = 0  # steps that did not draft: closed gate, or a plain timing probe
        self._since_probe = 0
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
        becomes ``min_accepted``; it is kept as :attr:`break_even_accepted`.

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

    @property
    def is_open(self) -> bool:
        """True while drafting pays: every step drafts, except that a timed gate leaves one
        step in ``probe_every`` plain."""
        if self.rows_seen < self.warmup_rows or self.mean_accepted is None:
            return True
        if self.draft_s_per_token is not None and self.plain_s_per_token is not None:
            return self.draft_s_per_token <= self.plain_s_per_token
        return self.mean_accepted >= self.min_accepted

    def should_draft(self) -> bool:
        """Whether this step drafts (call once per step that has rows able to draft).

        While closed, every ``probe_every``-th step drafts. Once drafting steps are timed, an
        open gate also leaves every ``probe_every``-th step plain, so that the throughput it
        compares against stays measured."""
        if self.is_open:
            if self.draft_s_per_token is None:
                self._since_probe = 0
                return True
            self._since_probe += 1
            if self._since_probe < self.probe_every:
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
        when the caller times its steps (pass it only for steps of decode rows alone)."""
        if num_rows < 0 or num_accepted < 0:
            raise ValueError(
                f"num_rows and num_accepted must be >= 0, got {num_rows} and {num_accepted}"
            )
        _check_seconds(seconds)
        if num_rows == 0:
            return
        self.mean_accepted = self._average(self.mean_accepted, num_accepted / num_rows)
        self.rows_seen += num_rows
        if seconds is not None:
            per_token = seconds / (num_rows + num_accepted)
            self.draft_s_per_token = self._average(self.draft_s_per_token, per_token)

    def record_plain(self, num_rows: int, seconds: float) -> None:
        """Fold in one timed step that did not draft: ``num_rows`` decode rows, one token each,
        in ``seconds`` (pass only steps of decode rows alone, like :meth:`record`)."""
        if num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {num_rows}")
        _check_seconds(seconds)
        if num_rows:
            self.plain_s_per_token = self._average(self.plain_s_per_token, seconds / num_rows)

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new


def _check_seconds(seconds: float | None) -> None:
    if seconds is None:
        return
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds: expected a finite number > 0, got {seconds!r}")
