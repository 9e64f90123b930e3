"""`DSparkSpeculator`: the engine's decode steps through a DSpark drafter.

The DSpark step itself (track each sequence's drafter context, draft, schedule, verify, accept)
is :class:`deepinfer_spec.BatchSpeculator`; this adapter only translates the engine's batch and
forward outputs to its rows and back. The engine calls :meth:`DSparkSpeculator.propose` with
every step's batch before its ONE forward over the flat ragged batch and
:meth:`DSparkSpeculator.accept` with the forward's outputs after it; neither sees the engine.

What stays here is what only the engine knows: a sequence's hard constraints masking the
drafter as it draws (``engine/draft_mask.py``), the target's logits processed exactly as the
sampler would (penalties, bias, grammar masks, the filtered distribution of sampled rows: then
verification stays lossless), and the per-request metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer.engine.chunk import StepBatch
from deepinfer.engine.draft_mask import DraftMask
from deepinfer.engine.sampler import prepare_verify_logits, sampling_tensors
from deepinfer.engine.sequence import Sequence
from deepinfer.engine.speculation import Drafts, ForwardOutput
from deepinfer_kernels import sampling_probs
from deepinfer_spec import (
    BatchSpeculator,
    DraftGate,
    DSparkDrafter,
    SpecStats,
    StepPlan,
    StepRow,
    VerifyScheduler,
)


@dataclass
class DSparkDrafts(Drafts):
    """One step's proposal plus the plan :meth:`DSparkSpeculator.accept` verifies."""

    plan: StepPlan | None = None
    seqs: list[Sequence] = field(default_factory=list)


class DSparkSpeculator:
    """Drafts, schedules and verifies for an :class:`~deepinfer.engine.engine.LLMEngine`
    (arguments as :class:`deepinfer_spec.BatchSpeculator`; ``max_seqs`` is the engine's
    ``max_num_seqs``)."""

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
        self.spec = BatchSpeculator(
            drafter,
            scheduler,
            max_seqs=max_seqs,
            sts_greedy=sts_greedy,
            sts_sampling=sts_sampling,
            gate=gate,
        )

    @classmethod
    def over(cls, spec: BatchSpeculator) -> DSparkSpeculator:
        """The engine's speculator over a ready ``spec`` (`deepinfer_spec.load_speculator`)."""
        speculator = cls.__new__(cls)
        speculator.spec = spec
        return speculator

    @property
    def drafter(self) -> DSparkDrafter:
        return self.spec.drafter

    @property
    def layer_ids(self) -> list[int]:
        """Target layers whose outputs the drafter reads as context."""
        return list(self.spec.drafter.config.target_layer_ids)

    @property
    def stats(self) -> SpecStats:
        return self.spec.stats

    @property
    def scheduler(self) -> VerifyScheduler:
        return self.spec.scheduler

    @property
    def gate(self) -> DraftGate | None:
        return self.spec.gate

    @gate.setter
    def gate(self, gate: DraftGate | None) -> None:
        self.spec.gate = gate

    def num_lookahead(self, seq: Sequence, max_model_len: int) -> int:
        """Most drafts worth verifying for ``seq`` now: ``gamma`` capped so that no verified
        token lies past what the request may still emit or past the context."""
        remaining = seq.params.max_tokens - len(seq.output_ids) - 1
        room = max_model_len - seq.num_tokens
        return max(0, min(self.spec.gamma, remaining, room))

    def release(self, seq_id: int) -> None:
        """Forget a finished or preempted sequence (a preempted one re-reads its context)."""
        self.spec.release(seq_id)

    @torch.no_grad()
    def propose(self, batch: StepBatch) -> DSparkDrafts:
        """Draft for the decodes of ``batch`` that may draft; extend chunks back over positions
        the drafter's context never saw."""
        rows = [
            StepRow(
                c.seq.seq_id,
                c.start,
                c.end,
                c.seq.all_ids[c.start],
                c.max_drafts,
                float(c.seq.params.temperature),
            )
            for c in batch.chunks
        ]
        plan = self.spec.plan(rows)
        seqs = [batch.chunks[i].seq for i in plan.drafting]
        if seqs:
            # Hard constraints (grammar, allowed ids, min_tokens) mask the drafter as it draws,
            # so it does not propose tokens verification can only reject.
            mask = DraftMask(seqs, self.drafter.vocab_size, self.drafter.draft_vocab_ids)
            try:
                # The engine's generator, so a seeded engine drafts the same tokens every run.
                self.spec.draft(plan, mask if mask.active else None, generator=batch.generator)
            finally:
                mask.close()
        return DSparkDrafts(bases=plan.bases, tokens=plan.drafts, plan=plan, seqs=seqs)

    @torch.no_grad()
    def accept(
        self, batch: StepBatch, drafts: Drafts, outputs: ForwardOutput
    ) -> list[list[int] | None]:
        """Verify the drafts against the forward's logits; the rows' features go to the
        drafter's context."""
        plan = drafts.plan if isinstance(drafts, DSparkDrafts) else None
        if plan is None or len(plan.rows) != len(batch.chunks):
            raise ValueError("drafts: expected this speculator's proposal for this batch")
        assert isinstance(drafts, DSparkDrafts)
        layers = outputs.layers
        features = layers[0] if len(layers) == 1 else torch.cat(layers, dim=-1)
        total = int(features.shape[0])
        # A row that is the whole forward (a batch-1 step) takes the features as they are.
        rows = [
            features
            if off == 0 and row.end - base + len(d) == total
            else features[off : off + row.end - base + len(d)]
            for row, base, d, off in zip(plan.rows, plan.bases, plan.drafts, outputs.offsets)
        ]
        logits, target = self._verify_logits(plan, drafts.seqs, outputs)
        results = self.spec.accept(
            plan, rows, logits, target_probs=target, generator=batch.generator
        )
        for i, result in zip(plan.drafting, (results[i] for i in plan.drafting)):
            assert result is not None
            m = batch.chunks[i].seq.metrics
            m.num_spec_steps += 1
            m.num_verified_drafts += len(plan.drafts[i])
            m.num_accepted_drafts += result.num_accepted
        return [None if r is None else r.tokens for r in results]

    def _verify_logits(
        self, plan: StepPlan, seqs: list[Sequence], outputs: ForwardOutput
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The target's logits at every drafting row's anchor and drafts, as the sampler sees
        them, and the filtered distributions of sampled rows."""
        if plan.block is None:
            return None, None
        flat = plan.verify_rows(outputs.offsets)
        num, first = len(plan.drafting), flat[0]
        # A batch-1 block (or any whose rows follow each other) is a range of the forward's
        # rows: a view, not an index tensor and a gather.
        rows: torch.Tensor | slice = slice(first, first + len(flat))
        if flat != list(range(first, first + len(flat))):
            rows = torch.tensor(flat, dtype=torch.int64, device=outputs.hidden.device)
        logits = outputs.logits(rows)
        if logits.dtype != torch.float32:
            logits = logits.float()
        logits = logits.reshape(num, len(flat) // num, logits.shape[-1])
        if logits.device.type != "cpu":
            logits = logits.cpu()
        vocab = logits.shape[-1]
        # Penalties, bias, min_tokens bans, structured-output masks and logits processors act on
        # the target's distribution at every block position: verification then stays lossless
        # w.r.t. what plain sampling would draw.
        logits = prepare_verify_logits(seqs, [plan.drafts[i] for i in plan.drafting], logits)
        params = [s.params for s in seqs]
        if not any(p.temperature > 0 for p in params):
            return logits, None
        width = logits.shape[1]
        target = sampling_probs(logits.reshape(-1, vocab), *sampling_tensors(params, repeat=width))
        return logits, target.reshape(num, width, vocab)
