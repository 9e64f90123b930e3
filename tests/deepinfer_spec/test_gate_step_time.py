"""The draft gate times a whole step: from its plan to the next, the caller's sampling of
plain rows included, and only while the same sequences keep decoding."""

from __future__ import annotations

import time

import torch

from deepinfer_spec import (
    BatchSpeculator,
    DraftGate,
    DSparkConfig,
    DSparkDrafter,
    FixedGammaScheduler,
    RecomputeTarget,
    StepRow,
)
from deepinfer_spec.testing import TinyTarget


class ScriptedGate(DraftGate):
    """Drafts on the steps it is told to and keeps every time it is given."""

    def __init__(self, script: list[bool]) -> None:
        super().__init__(min_accepted=0.0, warmup_rows=0)
        self.script = list(script)
        self.timed: list[tuple[str, float | None]] = []

    def should_draft(self, num_rows: int | None = None) -> bool:
        return self.script.pop(0)

    def record(self, num_rows: int, num_accepted: int, seconds: float | None = None) -> None:
        self.timed.append(("draft", seconds))
        super().record(num_rows, num_accepted, seconds)

    def record_plain(self, num_rows: int, seconds: float) -> None:
        self.timed.append(("plain", seconds))
        super().record_plain(num_rows, seconds)


def _speculator(gate: DraftGate) -> tuple[BatchSpeculator, int]:
    model = TinyTarget(vocab_size=32, hidden_size=32, num_layers=2, seed=0)
    config = DSparkConfig(target_layer_ids=(0, 1), gamma=3, window=8, markov_rank=4)
    drafter = DSparkDrafter(config, RecomputeTarget(model)).eval()
    return BatchSpeculator(drafter, FixedGammaScheduler(1), max_seqs=2, gate=gate), 64


def _step(spec: BatchSpeculator, key: str, pos: int, width: int, after: float = 0.0) -> int:
    plan = spec.plan([StepRow(key, pos, pos + 1, 3, 1)])
    spec.draft(plan)
    drafts = plan.drafts[0]
    logits = None
    if plan.block is not None:  # a target that rejects every draft: one token per step
        logits = torch.zeros(1, plan.block.width, 32)
        logits[..., (drafts[0] + 1) % 32] = 1.0
    spec.accept(plan, [torch.zeros(1 + len(drafts), width)], logits)
    time.sleep(after)  # the caller samples the plain rows, appends tokens ...
    return pos + 1


def test_a_step_is_timed_to_the_next_plan() -> None:
    gate = ScriptedGate([False, True, False, False])
    spec, width = _speculator(gate)
    prefill = spec.plan([StepRow("a", 0, 4, 3, 0)])
    spec.accept(prefill, [torch.zeros(4, width)], None)
    pos = 4
    for _ in range(3):
        pos = _step(spec, "a", pos, width, after=0.02)
    # Each of the three steps is told when the next one plans, its tail included.
    spec.plan([StepRow("a", pos, pos + 1, 3, 1)])
    assert [kind for kind, _ in gate.timed] == ["plain", "draft", "plain"]
    assert all(seconds is not None and seconds >= 0.02 for _, seconds in gate.timed)


def test_a_gap_between_sequences_is_not_a_step() -> None:
    gate = ScriptedGate([True, False])
    spec, width = _speculator(gate)
    prefill = spec.plan([StepRow("a", 0, 4, 3, 0)])
    spec.accept(prefill, [torch.zeros(4, width)], None)
    _step(spec, "a", 4, width)
    spec.release("a")  # the sequence ended: its last step's acceptance, untimed
    assert gate.timed == [("draft", None)]
    assert gate.rows_seen == 1
    prefill = spec.plan([StepRow("b", 0, 4, 3, 0)])
    spec.accept(prefill, [torch.zeros(4, width)], None)
    _step(spec, "b", 4, width)
    spec.plan([StepRow("c", 0, 2, 3, 0)])  # other sequences next: the plain step is untimed
    assert gate.timed == [("draft", None)]
