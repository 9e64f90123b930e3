"""`DSparkSpeculator`: the engine's decode steps through a DSpark drafter.

The engine calls :meth:`DSparkSpeculator.propose` with every step's batch before its forward
and :meth:`DSparkSpeculator.accept` with the forward's outputs after it; the speculator never
sees the engine. One step is still ONE target forward over the flat ragged batch:

1. for each decoding sequence whose drafter state is in sync, the drafter proposes ``gamma``
   tokens after the anchor (the last sampled token, which the target has not read yet);
2. the verification scheduler (DSpark's prefix scheduler over the profiled ``SPS(B)`` curve)
   picks ``n_b`` drafts per sequence, capped by the look-ahead slots the batch policy granted
   (which count against its token and block budget);
3. the forward runs over prefill chunks and over ``[anchor ; d_1 .. d_n]`` of each decode
   sequence (query length ``1 + n``), capturing the drafter's target layers;
4. ``greedy_verify`` (temperature 0) or ``speculative_verify`` (on the filtered distribution
   the request asked for) accepts a prefix; the engine puts the accepted tokens plus the
   correction/bonus through its stop rules (a stop token mid-block truncates the rest);
5. the engine's KV "rollback" lowers ``num_computed`` (stale slots are overwritten next step)
   and the drafter's ring buffer receives the context entries (keys and values of the
   drafter's layers, ``DSparkDrafter.context_kv``) of the anchor and accepted drafts.

Invariant: a tracked sequence's context count (ring plus pending rows) equals its
``num_computed``. Positions the ring never saw (a prefix loaded from the cache) are recomputed,
at most ``window`` of them, by extending the sequence's chunk backwards; K/V of identical tokens
at identical positions is rewritten.

Context features are projected lazily: a step only keeps the raw target features of its new
positions, and they are projected (and turned into the drafter's keys and values) into the
ring, for all drafting sequences at once, when a sequence drafts (or has a window's worth
pending). A step that does not draft (the draft gate is closed, or the request cannot draft)
then does no drafter work beyond keeping those rows, and a batch of drafting sequences pays one
projection, not one per sequence. A proposal projects only its own block: the context's keys
and values are computed once per position, when it enters the ring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from deepinfer.engine.chunk import Chunk, StepBatch
from deepinfer.engine.draft_mask import DraftMask
from deepinfer.engine.sampler import prepare_verify_logits, sampling_tensors
from deepinfer.engine.sequence import Sequence
from deepinfer.engine.speculation import Drafts, ForwardOutput
from deepinfer_kernels import sampling_probs
from deepinfer_spec import (
    ContextRing,
    DraftBlock,
    DraftGate,
    DSparkDrafter,
    VerifyScheduler,
    draft_block,
    verify_block,
)


@dataclass
class SpecStats:
    """Engine-wide speculation counters (per-request ones live in ``RequestMetrics``)."""

    num_steps: int = 0  # forwards that verified drafts of at least one sequence
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
class _Work:
    """One chunk of this step: tokens ``base .. end`` of the sequence, then ``drafts``."""

    chunk: Chunk
    base: int
    drafts: list[int]
    draft_row: int = -1  # row in the step's draft tensors, -1 if it did not draft

    @property
    def seq(self) -> Sequence:
        return self.chunk.seq

    @property
    def end(self) -> int:
        return self.chunk.end


@dataclass
class DSparkDrafts(Drafts):
    """One step's proposal plus what :meth:`DSparkSpeculator.accept` needs to verify it."""

    works: list[_Work] = field(default_factory=list)
    drafting: list[_Work] = field(default_factory=list)
    draft: DraftBlock | None = None
    gated: bool = False
    start: float = 0.0


class DSparkSpeculator:
    """Drafts, schedules and verifies for an :class:`~deepinfer.engine.engine.LLMEngine`.

    Args:
        drafter: a trained :class:`deepinfer_spec.DSparkDrafter` whose target is the engine's model.
        scheduler: how many drafts to verify per sequence (``PrefixScheduler`` over a profiled
            curve in practice, see :func:`deepinfer.speculative.profile_target_sps`).
        max_seqs: drafter state slots (the engine's ``max_num_seqs``).
        sts_greedy / sts_sampling: STS temperatures ``[gamma]`` calibrating the confidence of
            greedy / sampled requests (``None``: raw confidence).
        gate: a :class:`deepinfer_spec.DraftGate` that pauses drafting while drafts are not
            accepted (``None``: draft on every step).
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
        if not isinstance(max_seqs, int) or max_seqs < 1:
            raise ValueError(f"max_seqs: expected a positive int, got {max_seqs!r}")
        self.drafter = drafter.eval()
        self.scheduler = scheduler
        self.gamma = drafter.config.gamma
        self.window = drafter.config.window
        self.layer_ids = list(drafter.config.target_layer_ids)
        for name, temps in (("sts_greedy", sts_greedy), ("sts_sampling", sts_sampling)):
            if temps is not None and tuple(temps.shape) != (self.gamma,):
                raise ValueError(f"{name}: expected shape ({self.gamma},), got {temps.shape}")
        self.sts_greedy, self.sts_sampling = sts_greedy, sts_sampling
        if gate is not None and not isinstance(gate, DraftGate):
            raise TypeError(f"gate: expected DraftGate or None, got {type(gate).__name__}")
        self.gate = gate
        weight = drafter.context_proj.weight
        self.device = weight.device
        # The ring keeps each position's keys and values for the drafter's layers (its
        # context_kv), not its projected features: a proposal then projects only its block.
        self.ring = ContextRing(
            max_seqs, self.window, drafter.context_kv_dim, dtype=weight.dtype, device=weight.device
        )
        self._slots: dict[int, int] = {}
        # Per slot: positions seen (ring + pending) and raw features not yet projected.
        self._counts: dict[int, int] = {}
        self._pending: dict[int, list[torch.Tensor]] = {}
        self._free = list(range(max_seqs - 1, -1, -1))
        self.stats = SpecStats()

    # ------------------------------------------------------------------ engine seam
    def num_lookahead(self, seq: Sequence, max_model_len: int) -> int:
        """Most drafts worth verifying for ``seq`` now: ``gamma`` capped so that no verified
        token lies past what the request may still emit or past the context."""
        remaining = seq.params.max_tokens - len(seq.output_ids) - 1
        room = max_model_len - seq.num_tokens
        return max(0, min(self.gamma, remaining, room))

    def release(self, seq_id: int) -> None:
        """Forget a finished or preempted sequence (a preempted one re-prefills its state)."""
        slot = self._slots.pop(seq_id, None)
        if slot is not None:
            self._pending.pop(slot, None)
            self._free.append(slot)

    @torch.no_grad()
    def propose(self, batch: StepBatch) -> DSparkDrafts:
        """Draft for the decodes of ``batch`` that may draft; extend chunks back over positions
        the drafter's context never saw."""
        start = time.perf_counter()
        works = [self._prepare(c) for c in batch.chunks]
        drafting = [w for w in works if w.chunk.max_drafts > 0 and self._in_sync(w)]
        gated = False
        if drafting and self.gate is not None and not self.gate.should_draft():
            # A step without drafts is a plain decode step; the ring still gets its features.
            drafting, gated = [], True
            self.stats.num_gated_steps += 1
        draft = self._propose(drafting)
        return DSparkDrafts(
            bases=[w.base for w in works],
            tokens=[w.drafts for w in works],
            works=works,
            drafting=drafting,
            draft=draft,
            gated=gated,
            start=start,
        )

    @torch.no_grad()
    def accept(
        self, batch: StepBatch, drafts: Drafts, outputs: ForwardOutput
    ) -> list[list[int] | None]:
        """Verify the drafts against the forward's logits; queue every row's new features."""
        if not isinstance(drafts, DSparkDrafts) or len(drafts.works) != len(batch.chunks):
            raise ValueError("drafts: expected this speculator's proposal for this batch")
        works, drafting = drafts.works, drafts.drafting
        features = torch.cat(outputs.layers, dim=-1)
        if drafting:
            self.stats.num_steps += 1
            self.stats.verified_per_step.append(sum(len(w.drafts) for w in drafting))
        accepted = self._verify(works, outputs, drafts.draft, batch.generator)
        emitted: list[list[int] | None] = []
        for w, off in zip(works, outputs.offsets):
            known = w.end - w.base
            if w.draft_row >= 0:
                num_acc, tokens = accepted[w.draft_row]
                self._append_features(w, features[off : off + known + num_acc])
                self._record(w, num_acc, len(tokens))
                emitted.append(tokens)
            else:
                self._append_features(w, features[off : off + known])
                emitted.append(None)
        if self.gate is not None and (drafting or drafts.gated):
            self._inform_gate(works, drafting, accepted, time.perf_counter() - drafts.start)
        return emitted

    def _inform_gate(
        self,
        works: list[_Work],
        drafting: list[_Work],
        accepted: dict[int, tuple[int, list[int]]],
        seconds: float,
    ) -> None:
        """Accepted drafts to the gate, and the step's time when it compares like with like: a
        step of decode rows only, all drafting (or all gated), no prefill chunk in it."""
        assert self.gate is not None
        decode_only = all(w.chunk.length == 1 and w.base == w.chunk.start for w in works)
        timed = decode_only and len(drafting) in (0, len(works))
        if not drafting:
            if timed:
                self.gate.record_plain(len(works), seconds)
            return
        num_accepted = sum(num for num, _ in accepted.values())
        self.gate.record(len(drafting), num_accepted, seconds if timed else None)

    # ------------------------------------------------------------------ steps
    def _prepare(self, chunk: Chunk) -> _Work:
        """Give the sequence a ring slot and extend the chunk back over positions the ring
        never saw (at most ``window`` of them; older ones can never be attended to)."""
        seq = chunk.seq
        slot = self._slot(seq.seq_id)
        if slot is None:
            return _Work(chunk, chunk.start, [])
        count = self._counts[slot]
        if count > chunk.start:  # cannot happen while release() is called on preemption
            self._reset(slot)
            count = 0
        base = max(count, chunk.start - self.window)
        if count < base:
            gap = base - count
            self._flush([slot])
            zeros = torch.zeros(1, gap, self.ring.feature_dim, device=self.device)
            self.ring.append(torch.tensor([slot]), zeros, torch.tensor([gap]))
            self._counts[slot] += gap
        return _Work(chunk, base, [])

    def _in_sync(self, w: _Work) -> bool:
        return w.base == w.chunk.start and w.seq.seq_id in self._slots

    def _propose(self, drafting: list[_Work]) -> DraftBlock | None:
        """Draft for every sequence in ``drafting`` and schedule how many to verify (the DSpark
        step's first half, ``deepinfer_spec.draft_block``, as ``SpecDecoder`` runs it)."""
        if not drafting:
            return None
        slot_ids = [self._slots[w.seq.seq_id] for w in drafting]
        self._flush(slot_ids)
        slots = torch.tensor(slot_ids, device=self.device)
        anchors = torch.tensor(
            [w.seq.all_ids[w.chunk.start] for w in drafting], dtype=torch.int64, device=self.device
        )
        context, valid = self.ring.view(slots)
        # Hard constraints (grammar, allowed ids, min_tokens) mask the drafter as it draws, so
        # it does not propose tokens verification can only reject (engine/draft_mask.py).
        mask = DraftMask(
            [w.seq for w in drafting], self.drafter.vocab_size, self.drafter.draft_vocab_ids
        )
        try:
            block = draft_block(
                self.drafter,
                anchors,
                context,
                valid,
                [float(w.seq.params.temperature) for w in drafting],
                self.scheduler,
                sts_greedy=self.sts_greedy,
                sts_sampling=self.sts_sampling,
                max_drafts=[w.chunk.max_drafts for w in drafting],
                context_is_kv=True,
                logits_hook=mask if mask.active else None,
            )
        finally:
            mask.close()
        for i, w in enumerate(drafting):
            w.draft_row = i
            w.drafts = block.drafts(i)
        return block

    def _verify(
        self,
        works: list[_Work],
        outputs: ForwardOutput,
        block: DraftBlock | None,
        generator: torch.Generator,
    ) -> dict[int, tuple[int, list[int]]]:
        """``draft_row -> (num_accepted, emitted tokens)`` for every drafting sequence (the
        DSpark step's second half, ``deepinfer_spec.verify_block``)."""
        if block is None:
            return {}
        rows = [(w, off) for w, off in zip(works, outputs.offsets) if w.draft_row >= 0]
        width = block.width
        # Row b's verify block: the anchor's row then its drafts', padded by repeating the last.
        index = torch.tensor(
            [
                [off + (w.end - w.base) - 1 + min(j, len(w.drafts)) for j in range(width)]
                for w, off in rows
            ],
            device=outputs.hidden.device,
        )
        logits = outputs.logits(index.reshape(-1)).float()
        vocab = logits.shape[-1]
        logits = logits.reshape(len(rows), width, vocab).cpu()
        # Penalties, bias, min_tokens bans, structured-output masks and logits processors act on
        # the target's distribution at every block position (sampler.prepare_verify_logits):
        # verification then stays lossless w.r.t. what plain sampling would draw.
        logits = prepare_verify_logits(
            [w.seq for w, _ in rows], [w.drafts for w, _ in rows], logits
        )
        params = [w.seq.params for w, _ in rows]
        target: torch.Tensor | None = None
        if any(p.temperature > 0 for p in params):
            # Sampled rows verify against exactly the filtered distribution they sample from.
            flat = logits.reshape(-1, vocab)
            target = sampling_probs(flat, *sampling_tensors(params, repeat=width)).reshape(
                len(rows), width, vocab
            )
        # The engine built these operands (ids from the drafter, counts from the scheduler):
        # the value checks (a scan of every logit for NaN) are skipped.
        verdict = verify_block(
            block,
            logits,
            [p.temperature for p in params],
            target_probs=target,
            generator=generator,
            check_values=False,
        )
        return {
            w.draft_row: (int(verdict.num_accepted[i]), verdict.tokens(i))
            for i, (w, _) in enumerate(rows)
        }

    def _append_features(self, w: _Work, features: torch.Tensor) -> None:
        """Queue the raw features of the sequence's new positions (projected by _flush)."""
        slot = self._slots.get(w.seq.seq_id)
        rows = int(features.shape[0])
        if slot is None or rows == 0:
            return
        pending = self._pending.setdefault(slot, [])
        pending.append(features)
        self._counts[slot] += rows
        # Bounded memory: a sequence that never drafts still flushes every `window` positions.
        if sum(int(f.shape[0]) for f in pending) >= self.window:
            self._flush([slot])

    def _flush(self, slots: list[int]) -> None:
        """Project the pending features of ``slots`` and append their keys and values to the
        ring: one projection, one append."""
        todo = [(slot, self._pending.pop(slot)) for slot in slots if self._pending.get(slot)]
        if not todo:
            return
        lengths = [sum(int(f.shape[0]) for f in chunks) for _, chunks in todo]
        flat = torch.cat([f for _, chunks in todo for f in chunks]).to(self.device)
        entries = self.drafter.context_kv(self.drafter.project_context(flat))
        if len(todo) == 1:
            ragged = entries[None]
        else:  # pad the entries (not the wider raw rows) to [B, T, D]
            ragged = entries.new_zeros(len(todo), max(lengths), entries.shape[-1])
            for i, part in enumerate(torch.split(entries, lengths)):
                ragged[i, : lengths[i]] = part
        self.ring.append(torch.tensor([slot for slot, _ in todo]), ragged, torch.tensor(lengths))

    def _reset(self, slot: int) -> None:
        self.ring.reset(torch.tensor([slot]))
        self._counts[slot] = 0
        self._pending.pop(slot, None)

    def _record(self, w: _Work, num_accepted: int, num_emitted: int) -> None:
        m = w.seq.metrics
        m.num_spec_steps += 1
        m.num_verified_drafts += len(w.drafts)
        m.num_accepted_drafts += num_accepted
        self.stats.num_rows += 1
        self.stats.num_verified += len(w.drafts)
        self.stats.num_accepted += num_accepted
        self.stats.num_emitted += num_emitted

    def _slot(self, seq_id: int) -> int | None:
        slot = self._slots.get(seq_id)
        if slot is None and self._free:
            slot = self._free.pop()
            self._slots[seq_id] = slot
            self._reset(slot)
        return slot
