"""`BatchSpeculator`: the DSpark step (``deepinfer_spec.step``) over a continuous batch.

An engine's step reads a flat ragged batch: prefill chunks and decodes of many sequences, each
with its own sampling temperature and room for drafts. This class keeps the drafter's side of
such a batch and knows nothing of the engine; a caller describes each row as a
:class:`StepRow` and runs its own forward in between:

1. :meth:`BatchSpeculator.plan`: track every row's sequence, say from which position its
   features must be re-read (``StepPlan.bases``: positions a prefix cache skipped), pick the
   rows that draft (in sync, granted slots, the draft gate open);
2. :meth:`BatchSpeculator.draft`: :func:`~deepinfer_spec.step.draft_block` for those rows
   (propose ``gamma`` tokens, STS-calibrate, schedule ``n_b`` per row, capped by the slots);
3. the caller's forward over each row's positions ``base .. end`` then its drafts, taking the
   target's logits at :meth:`StepPlan.verify_index` (and processing them as its sampler does);
4. :meth:`BatchSpeculator.accept`: :func:`~deepinfer_spec.step.verify_block`, then every row's
   known and accepted positions enter the drafter's context (:class:`LazyContext`), the
   counters and the draft gate are updated.

Example (``rows``, ``forward`` and ``logits_at`` are the caller's)::

    spec = BatchSpeculator(drafter, PrefixScheduler(curve), max_seqs=8)
    plan = spec.plan(rows)
    spec.draft(plan)
    features, offsets = forward(rows, plan.bases, plan.drafts)
    results = spec.accept(plan, features, logits_at(plan.verify_index(offsets)))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.lazy_context import LazyContext
from deepinfer_spec.scheduling import DraftGate, VerifyScheduler
from deepinfer_spec.step import (
    DraftBlock,
    draft_block,
    greedy_accepts,
    target_argmax,
    verify_block,
)

LogitsHook = Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class StepRow:
    """One chunk of a step: positions ``start .. end`` of sequence ``key`` are new.

    ``anchor``: the token at position ``start`` (for a decode, the last sampled token, which
    the target has not read yet); ``max_drafts``: draft slots granted after the chunk (0: the
    row does not draft); ``temperature``: its sampling temperature (0: greedy).
    """

    key: Hashable
    start: int
    end: int
    anchor: int
    max_drafts: int = 0
    temperature: float = 0.0


@dataclass(frozen=True)
class RowResult:
    """A drafting row's verdict: ``num_accepted`` drafts, then ``tokens`` (the accepted drafts
    plus the correction or bonus token)."""

    num_accepted: int
    tokens: list[int]


@dataclass
class SpecStats:
    """Counters over a speculator's life."""

    num_steps: int = 0  # steps that verified drafts of at least one row
    num_rows: int = 0  # (sequence, step) pairs that drafted
    num_verified: int = 0
    num_accepted: int = 0
    num_emitted: int = 0
    num_gated_steps: int = 0  # steps whose rows could draft but the draft gate said no
    verified_per_step: list[int] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per drafting (sequence, step), bonus included."""
        return self.num_emitted / self.num_rows if self.num_rows else 0.0

    @property
    def mean_verified_per_row(self) -> float:
        return self.num_verified / self.num_rows if self.num_rows else 0.0


@dataclass
class StepPlan:
    """One step's proposal: ``bases[i] <= rows[i].start`` is where row ``i``'s forward starts,
    ``drafts[i]`` the drafts to verify after it, ``drafting`` the rows that drafted (in the
    order of ``block``'s rows)."""

    rows: list[StepRow]
    bases: list[int]
    drafts: list[list[int]]
    drafting: list[int]
    gated: bool = False
    block: DraftBlock | None = None
    start: float = 0.0

    @property
    def width(self) -> int:
        """Verify positions per drafting row (:attr:`DraftBlock.width`, from the drafts' lengths:
        no tensor read)."""
        return max(max((len(self.drafts[i]) for i in self.drafting), default=0), 1) + 1

    def verify_rows(self, offsets: Sequence[int]) -> list[int]:
        """:meth:`verify_index` as plain ints, row-major (empty when nothing drafted)."""
        if self.block is None:
            return []
        width = self.width
        return [
            offsets[i] + self.rows[i].end - self.bases[i] - 1 + min(j, len(self.drafts[i]))
            for i in self.drafting
            for j in range(width)
        ]

    def verify_index(self, offsets: Sequence[int]) -> torch.Tensor:
        """``[R, width]`` forward rows of each drafting row's anchor and drafts (short rows
        repeat their last draft), given ``offsets[i]``: row ``i``'s first forward row."""
        if self.block is None:
            return torch.empty(0, 1, dtype=torch.int64)
        index = torch.tensor(self.verify_rows(offsets), dtype=torch.int64)
        return index.reshape(len(self.drafting), self.width)


@dataclass(frozen=True)
class _GateReport:
    """A finished step's news for the draft gate, told at the next :meth:`BatchSpeculator.plan`
    (when the step, the caller's sampling of its plain rows included, is over)."""

    keys: tuple[Hashable, ...]
    num_rows: int
    drafting: int
    accepted: int
    timed: bool
    start: float


class BatchSpeculator:
    """Drafts, schedules and verifies for a continuous batch (see the module docstring).

    Args:
        drafter: a trained drafter.
        scheduler: how many drafts to verify per row (``PrefixScheduler`` over a profiled SPS
            curve in practice).
        max_seqs: sequences tracked at once.
        sts_greedy / sts_sampling: STS temperatures ``[gamma]`` calibrating the confidence of
            greedy / sampled rows (``None``: raw confidence).
        gate: a :class:`DraftGate` that pauses drafting while drafts do not pay (``None``: draft
            on every step).
    """

    def __init__(
        self,
        drafter: DSparkDrafter,
        scheduler: VerifyScheduler,
        *,
        max_seqs: int,
        sts_greedy: torch.Tensor | None = None,
        sts_sampling: torch.Tensor | None = None,
        gate: DraftGate | None = None,
    ) -> None:
        if not isinstance(drafter, DSparkDrafter):
            raise TypeError(f"drafter: expected DSparkDrafter, got {type(drafter).__name__}")
        if not isinstance(max_seqs, int) or isinstance(max_seqs, bool) or max_seqs < 1:
            raise ValueError(f"max_seqs: expected a positive int, got {max_seqs!r}")
        self.drafter = drafter.eval()
        self.scheduler = scheduler
        self.gamma = drafter.config.gamma
        for name, temps in (("sts_greedy", sts_greedy), ("sts_sampling", sts_sampling)):
            if temps is not None and tuple(temps.shape) != (self.gamma,):
                raise ValueError(f"{name}: expected shape ({self.gamma},), got {temps.shape}")
        self.sts_greedy, self.sts_sampling = sts_greedy, sts_sampling
        self.gate = gate
        self.context = LazyContext(drafter, max_seqs)
        self.stats = SpecStats()
        self._report: _GateReport | None = None

    @property
    def gate(self) -> DraftGate | None:
        return self._gate

    @gate.setter
    def gate(self, gate: DraftGate | None) -> None:
        if gate is not None and not isinstance(gate, DraftGate):
            raise TypeError(f"gate: expected DraftGate or None, got {type(gate).__name__}")
        self._gate = gate

    def release(self, key: Hashable) -> None:
        """Forget a finished or preempted sequence."""
        if self._report is not None and key in self._report.keys:
            self._tell_gate(None)  # its last step's acceptance, untimed
        self.context.release(key)

    def plan(self, rows: Sequence[StepRow]) -> StepPlan:
        """Track every row's sequence and pick the rows that draft this step."""
        start = time.perf_counter()
        rows = list(rows)
        self._tell_gate(rows, start)
        bases: list[int] = []
        drafting: list[int] = []
        for i, row in enumerate(rows):
            base = self.context.catch_up(row.key, row.start)
            bases.append(row.start if base is None else base)
            # Only a row whose context ends right before its anchor can draft now.
            if row.max_drafts > 0 and base == row.start:
                drafting.append(i)
        gated = False
        if drafting and self._gate is not None and not self._gate.should_draft(len(drafting)):
            # A step without drafts is a plain step; the context still gets its features.
            drafting, gated = [], True
            self.stats.num_gated_steps += 1
        return StepPlan(rows, bases, [[] for _ in rows], drafting, gated, None, start)

    @torch.no_grad()
    def draft(
        self,
        plan: StepPlan,
        logits_hook: LogitsHook | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        """Propose and schedule for ``plan.drafting`` (fills ``plan.block`` and ``drafts``).

        ``logits_hook(rows, k, prefix, logits)``: :func:`draft_block`'s hook; its ``rows``
        index ``plan.drafting``. ``generator``: randomness of sampled rows' drafts (``None``:
        torch's default generator).
        """
        if not plan.drafting:
            return
        rows = [plan.rows[i] for i in plan.drafting]
        context, valid = self.context.view([r.key for r in rows])
        anchors = torch.tensor([r.anchor for r in rows], dtype=torch.int64, device=context.device)
        block = draft_block(
            self.drafter,
            anchors,
            context,
            valid,
            [float(r.temperature) for r in rows],
            self.scheduler,
            sts_greedy=self.sts_greedy,
            sts_sampling=self.sts_sampling,
            max_drafts=[r.max_drafts for r in rows],
            context_is_kv=True,
            generator=generator,
            logits_hook=logits_hook,
        )
        plan.block = block
        # One read of each tensor for all rows (DraftBlock.drafts reads three per row).
        tokens = block.token_ids.tolist()
        for b, (i, n) in enumerate(zip(plan.drafting, block.num_draft_tokens.tolist())):
            plan.drafts[i] = tokens[b][:n]

    @torch.no_grad()
    def accept(
        self,
        plan: StepPlan,
        features: Sequence[torch.Tensor],
        logits: torch.Tensor | None,
        *,
        target_probs: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        check_values: bool = False,
    ) -> list[RowResult | None]:
        """Verify and let every row's new positions into the drafter's context.

        ``features[i]``: the target's captured features of row ``i``'s forward rows, from
        ``bases[i]`` on (its drafts' rows included); ``logits [R, width, V]``: the target at
        :meth:`StepPlan.verify_index` (``None`` when nothing drafted), processed as the caller
        samples; ``target_probs``: sampled rows' exact distributions (see
        :func:`verify_block`). Returns per row its :class:`RowResult`, ``None`` where it did
        not draft (the caller samples those rows itself).
        """
        if len(features) != len(plan.rows):
            raise ValueError(f"features: expected {len(plan.rows)} rows, got {len(features)}")
        results: list[RowResult | None] = [None] * len(plan.rows)
        if plan.block is not None:
            if logits is None:
                raise ValueError("logits: the plan drafted, the target's logits are needed")
            temperatures = [plan.rows[i].temperature for i in plan.drafting]
            drafts = [plan.drafts[i] for i in plan.drafting]
            if target_probs is None and not check_values and not any(temperatures):
                # Greedy rows only: verify_block's rule on plain ints (the drafts are lists
                # already; one argmax and one read of the target), no verdict tensors.
                width = plan.width
                if tuple(logits.shape[:2]) != (len(drafts), width):
                    raise ValueError(
                        f"logits: expected [{len(drafts)}, {width}, V], got {tuple(logits.shape)}"
                    )
                verdicts = greedy_accepts(drafts, target_argmax(logits))
            else:
                verdict = verify_block(
                    plan.block,
                    logits,
                    temperatures,
                    target_probs=target_probs,
                    generator=generator,
                    check_values=check_values,
                )
                verdicts = [
                    (int(verdict.num_accepted[b]), verdict.tokens(b)) for b in range(len(drafts))
                ]
            self.stats.num_steps += 1
            self.stats.verified_per_step.append(sum(len(d) for d in drafts))
            for i, (accepted, tokens) in zip(plan.drafting, verdicts):
                result = RowResult(accepted, tokens)
                results[i] = result
                self.stats.num_rows += 1
                self.stats.num_verified += len(plan.drafts[i])
                self.stats.num_accepted += result.num_accepted
                self.stats.num_emitted += len(result.tokens)
        for i, row in enumerate(plan.rows):
            done = results[i]
            known = row.end - plan.bases[i] + (0 if done is None else done.num_accepted)
            rows = features[i]
            self.context.push(row.key, rows if known == rows.shape[0] else rows[:known])
        if self._gate is not None and (plan.drafting or plan.gated):
            # Told at the next plan: a step ends after the caller has sampled its plain rows
            # (the LM head and sampling of a gated step happen after this call, a drafting
            # step's verified rows' head before it; timed here, a plain step missed ~0.15 of
            # its time and the measured break-even came out ~0.3 accepted drafts too high).
            decode_only = all(
                r.end - r.start == 1 and base == r.start for r, base in zip(plan.rows, plan.bases)
            )
            self._tell_gate(None)
            self._report = _GateReport(
                keys=tuple(r.key for r in plan.rows),
                num_rows=len(plan.rows),
                drafting=len(plan.drafting),
                accepted=sum(r.num_accepted for r in results if r is not None),
                timed=decode_only and len(plan.drafting) in (0, len(plan.rows)),
                start=plan.start,
            )
        return results

    def _tell_gate(self, rows: list[StepRow] | None, now: float = 0.0) -> None:
        """The previous step's accepted drafts to the gate, and its time (from its plan to this
        one) when it compares like with like: a step of decode rows only, all drafting (or all
        gated), no prefill chunk in it, followed at once by the same sequences' next step (a
        gap in which a sequence ended or arrived is not a step's time)."""
        report, self._report = self._report, None
        if report is None or self._gate is None:
            return
        seconds = None
        if report.timed and rows is not None and tuple(r.key for r in rows) == report.keys:
            seconds = now - report.start
        if not report.drafting:
            if seconds is not None:
                self._gate.record_plain(report.num_rows, seconds)
            return
        self._gate.record(report.drafting, report.accepted, seconds)
