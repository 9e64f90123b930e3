"""`BatchSpeculator` and `LazyContext`: the DSpark step over a continuous batch.

A small driver plays the engine: it describes each step's chunks as ``StepRow`` s, runs the
target over them (by recomputation) with the drafts appended, gathers the logits at
``StepPlan.verify_index`` from a flat ragged table, and samples the rows that did not draft.
Driven the way ``SpecDecoder`` steps (the prompt but its last token, then one anchor per step),
it must emit exactly ``SpecDecoder``'s tokens and accept exactly its drafts, greedy and sampled
with the same seed: the engine and ``SpecDecoder`` run one DSpark step.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from conftest import make_drafter
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_spec import (
    BatchSpeculator,
    DraftGate,
    DSparkDrafter,
    FixedGammaScheduler,
    LazyContext,
    SpecDecoder,
    StepRow,
)
from deepinfer_spec.testing import TinyTarget

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [7], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9]]


def drive(
    spec: BatchSpeculator,
    model: TinyTarget,
    prompts: Sequence[Sequence[int]],
    max_new: int,
    temperature: float,
    generator: torch.Generator | None = None,
    mixed: bool = True,
) -> tuple[list[list[int]], list[list[int]]]:
    """Decode every prompt as one batch; returns (tokens, accepted drafts per step) per row.

    ``mixed``: prefill chunks and drafting decodes share steps; else every prompt is read
    first, as ``SpecDecoder.add_requests`` does (same batches, so the same random draws)."""
    layers = list(spec.drafter.config.target_layer_ids)
    seqs = [list(p) for p in prompts]
    computed = [0] * len(seqs)
    out: list[list[int]] = [[] for _ in seqs]
    accepted: list[list[int]] = [[] for _ in seqs]
    live = list(range(len(seqs)))
    while live:
        rows = []
        for i in live:
            prefill = computed[i] + 1 < len(seqs[i])
            end = len(seqs[i]) - 1 if prefill else computed[i] + 1
            gamma = 0 if prefill else spec.gamma
            rows.append(StepRow(i, computed[i], end, seqs[i][computed[i]], gamma, temperature))
        if not mixed and any(r.max_drafts == 0 for r in rows):
            rows = [r for r in rows if r.max_drafts == 0]
        plan = spec.plan(rows)
        spec.draft(plan, generator=generator)
        feats, table, offsets = [], [], []
        for row, base, drafts in zip(rows, plan.bases, plan.drafts):
            ids = seqs[row.key][: row.end] + drafts  # type: ignore[index]
            scored = model.score(torch.tensor([ids]), layers)
            offsets.append(sum(int(t.shape[0]) for t in table))
            feats.append(scored.features[0, base:])
            table.append(scored.logits[0, base:])
        flat = torch.cat(table)
        logits = None
        if plan.block is not None:
            logits = flat[plan.verify_index(offsets)]
        results = spec.accept(plan, feats, logits, generator=generator)
        for row, off, result in zip(rows, offsets, results):
            i = int(row.key)  # type: ignore[call-overload]
            if result is None:
                computed[i] = row.end
                if row.end < len(seqs[i]):
                    continue  # a prefill chunk (the prompt's last token is the anchor)
                last = flat[off + row.end - plan.bases[rows.index(row)] - 1]
                new = [int(torch.argmax(last))]
            else:
                computed[i] = row.end + result.num_accepted
                new = result.tokens
                accepted[i].append(result.num_accepted)
            seqs[i].extend(new)
            out[i].extend(new)
        live = [i for i in live if len(out[i]) < max_new]
    return [o[:max_new] for o in out], accepted


def decoder_run(
    drafter: DSparkDrafter, target, temperature: float, generator: torch.Generator | None
) -> tuple[list[list[int]], list[list[int]]]:
    decoder = SpecDecoder(
        drafter,
        target,
        FixedGammaScheduler(drafter.config.gamma),
        temperature=temperature,
        generator=generator,
    )
    ids = list(range(len(PROMPTS)))
    decoder.add_requests(ids, PROMPTS)
    out: list[list[int]] = [[] for _ in ids]
    accepted: list[list[int]] = [[] for _ in ids]
    live = list(ids)
    while live:
        step = decoder.step(live)
        for row, rid in enumerate(step.request_ids):
            out[rid].extend(step.tokens(row))
            accepted[rid].append(int(step.num_accepted[row]))
        live = [r for r in live if len(out[r]) < 12]
    return [o[:12] for o in out], accepted


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_batch_speculator_runs_spec_decoders_step(target, tiny_model, temperature) -> None:
    drafter = make_drafter(target)
    spec = BatchSpeculator(drafter, FixedGammaScheduler(drafter.config.gamma), max_seqs=4)
    gen = torch.Generator().manual_seed(5)
    tokens, accepted = drive(spec, tiny_model, PROMPTS, 12, temperature, gen, mixed=False)
    want_tokens, want_accepted = decoder_run(
        drafter, target, temperature, torch.Generator().manual_seed(5)
    )
    assert tokens == want_tokens
    assert accepted == want_accepted
    if temperature == 0:
        assert tokens == [tiny_model.greedy(p, 12) for p in PROMPTS]
    assert spec.stats.num_rows == sum(len(a) for a in accepted)
    assert spec.stats.num_accepted > 0  # an untrained drafter, but some drafts survive
    assert spec.stats.num_accepted == sum(sum(a) for a in accepted)
    if temperature == 0:  # prefill chunks in drafting steps change nothing
        mixed = BatchSpeculator(drafter, FixedGammaScheduler(drafter.config.gamma), max_seqs=4)
        assert drive(mixed, tiny_model, PROMPTS, 12, 0.0)[0] == tokens


def test_a_closed_gate_drafts_nothing_and_stays_exact(target, tiny_model) -> None:
    drafter = make_drafter(target)
    gate = DraftGate(min_accepted=float("inf"), probe_every=1000, warmup_rows=0)
    gate.record(num_rows=1, num_accepted=0)
    spec = BatchSpeculator(drafter, FixedGammaScheduler(3), max_seqs=4, gate=gate)
    tokens, accepted = drive(spec, tiny_model, PROMPTS, 6, 0.0)
    assert tokens == [tiny_model.greedy(p, 6) for p in PROMPTS]
    assert accepted == [[], [], []] and spec.stats.num_rows == 0
    assert spec.stats.num_gated_steps == gate.num_skipped > 0


class RecordingGate(DraftGate):
    """A gate that keeps the batch sizes it was asked about and timed at."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[int | None] = []
        self.timed: list[tuple[str, int]] = []

    def should_draft(self, num_rows: int | None = None) -> bool:
        self.asked.append(num_rows)
        return super().should_draft(num_rows)

    def record(self, num_rows: int, num_accepted: int, seconds: float | None = None) -> None:
        if seconds is not None:
            self.timed.append(("draft", num_rows))
        super().record(num_rows, num_accepted, seconds)

    def record_plain(self, num_rows: int, seconds: float) -> None:
        self.timed.append(("plain", num_rows))
        super().record_plain(num_rows, seconds)


def test_the_gate_prices_each_step_at_its_batch_size_and_stays_exact(target, tiny_model) -> None:
    """``plan`` asks the gate with the number of rows able to draft; timed steps (decode rows
    only) report the same batch sizes, drafting and plain, so a measured break-even compares
    like with like; whichever steps the timed gate keeps plain, the tokens stay greedy."""
    drafter = make_drafter(target)
    gate = RecordingGate(min_accepted=0.0, probe_every=2, warmup_rows=0)
    spec = BatchSpeculator(drafter, FixedGammaScheduler(3), max_seqs=4, gate=gate)
    tokens, _ = drive(spec, tiny_model, PROMPTS, 10, 0.0, mixed=False)
    assert tokens == [tiny_model.greedy(p, 10) for p in PROMPTS]
    assert gate.asked and all(n is not None and 1 <= n <= len(PROMPTS) for n in gate.asked)
    kinds = {kind for kind, _ in gate.timed}
    assert kinds == {"draft", "plain"}  # the open timed gate keeps timing plain steps
    assert {n for _, n in gate.timed} <= set(gate.asked)
    assert spec.stats.num_gated_steps == gate.num_skipped > 0


def test_rows_past_the_slots_are_not_tracked_and_do_not_draft(target, tiny_model) -> None:
    drafter = make_drafter(target)
    spec = BatchSpeculator(drafter, FixedGammaScheduler(2), max_seqs=1)
    tokens, accepted = drive(spec, tiny_model, PROMPTS, 5, 0.0)
    assert tokens == [tiny_model.greedy(p, 5) for p in PROMPTS]
    assert accepted[0] and not accepted[1] and not accepted[2]  # one slot: the first row's
    spec.release(0)
    assert spec.context.catch_up(1, 0) == 0  # the freed slot serves the next sequence


def test_bad_arguments_name_themselves(target) -> None:
    drafter = make_drafter(target)
    with pytest.raises(ValueError, match="max_seqs"):
        BatchSpeculator(drafter, FixedGammaScheduler(2), max_seqs=0)
    with pytest.raises(ValueError, match="sts_greedy"):
        BatchSpeculator(drafter, FixedGammaScheduler(2), max_seqs=1, sts_greedy=torch.ones(2))
    with pytest.raises(TypeError, match="gate"):
        BatchSpeculator(drafter, FixedGammaScheduler(2), max_seqs=1, gate="open")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drafter"):
        BatchSpeculator(object(), FixedGammaScheduler(2), max_seqs=1)  # type: ignore[arg-type]
    spec = BatchSpeculator(drafter, FixedGammaScheduler(2), max_seqs=1)
    plan = spec.plan([StepRow("a", 0, 1, 3, 2, 0.0)])
    spec.draft(plan)
    with pytest.raises(ValueError, match="features"):
        spec.accept(plan, [], None)
    with pytest.raises(ValueError, match="logits"):
        spec.accept(plan, [torch.zeros(3, drafter.feature_dim)], None)


@settings(max_examples=12, deadline=None)
@given(
    pieces=st.lists(st.integers(0, 7), min_size=1, max_size=6),
    skipped=st.integers(0, 20),
)
def test_lazy_context_equals_the_eager_projection(pieces: list[int], skipped: int) -> None:
    """Whatever the pushes' sizes and a skipped prefix (a cache hit), the view of a sequence is
    the drafter's keys and values of the projection of its last ``window`` positions."""
    torch.set_num_threads(1)
    from deepinfer_spec import RecomputeTarget

    model = TinyTarget(vocab_size=32, hidden_size=32, num_layers=2, seed=0)
    drafter = make_drafter(RecomputeTarget(model))
    ctx = LazyContext(drafter, max_seqs=2)
    window = drafter.config.window
    total = skipped + sum(pieces)
    features = torch.randn(total, drafter.feature_dim, generator=torch.Generator().manual_seed(1))
    base = ctx.catch_up("s", skipped)
    assert base == max(0, skipped - window)
    ctx.push("s", features[base:skipped])
    at = skipped
    for n in pieces:
        ctx.push("s", features[at : at + n])
        at += n
    assert ctx.count("s") == total
    context, valid = ctx.view(["s"])
    kept = min(window, total)
    assert int(valid.sum()) == kept
    eager = drafter.context_kv(drafter.project_context(features[total - kept :]))
    torch.testing.assert_close(context[0][valid[0]], eager, atol=1e-5, rtol=1e-5)
    # A sequence that went back (recomputed from scratch) starts over.
    assert ctx.catch_up("s", 0) == 0 and ctx.count("s") == 0


def test_lazy_context_slots() -> None:
    from deepinfer_spec import RecomputeTarget

    drafter = make_drafter(RecomputeTarget(TinyTarget(32, 32, 2, seed=0)))
    ctx = LazyContext(drafter, max_seqs=1)
    assert ctx.catch_up("a", 0) == 0 and ctx.slot("a") == 0
    assert ctx.catch_up("b", 0) is None and ctx.slot("b") is None and ctx.count("b") == 0
    ctx.push("b", torch.zeros(2, drafter.feature_dim))  # untracked: ignored
    ctx.release("a")
    ctx.release("a")  # twice is harmless
    assert ctx.catch_up("b", 3) == 0 and ctx.slot("b") == 0
    with pytest.raises(ValueError, match="max_seqs"):
        LazyContext(drafter, max_seqs=0)
