"""The target's output reduced to a draft vocabulary gives the same loss as the full output."""

from __future__ import annotations

import pytest
import torch
from conftest import make_drafter

from deepinfer_spec import RecomputeTarget
from deepinfer_spec.adapter import TargetOutput
from deepinfer_spec.testing import TinyTarget
from deepinfer_spec.training import (
    DraftVocabTeacher,
    LossWeights,
    TrainConfig,
    dspark_loss,
    train_drafter,
)
from deepinfer_spec.training.loss import sample_anchors

SHORTLIST = [3, 9, 0, 17, 30, 12, 5, 21, 1, 2]


@pytest.mark.parametrize("weights", [LossWeights(), LossWeights(ce=0.3, tv=0.5, distill=0.7)])
def test_reduced_teacher_gives_the_full_outputs_loss_and_gradients(
    tiny_model: TinyTarget, weights: LossWeights
) -> None:
    d = make_drafter(RecomputeTarget(tiny_model)).restrict_vocab(SHORTLIST)
    ids = torch.randint(0, 32, (3, 16), generator=torch.Generator().manual_seed(1))
    out = tiny_model.score(ids, [0, 1])
    teacher = DraftVocabTeacher.from_target(out, d.draft_vocab_ids)
    rows, anchors = sample_anchors(torch.full((3,), 16), 4, 5, torch.Generator().manual_seed(2))

    def run(target_out: object) -> tuple[object, list[torch.Tensor]]:
        d.zero_grad(set_to_none=True)
        terms = dspark_loss(d, ids, target_out, rows, anchors, weights)  # type: ignore[arg-type]
        terms.total.backward()
        return terms, [p.grad.clone() for p in d.parameters() if p.grad is not None]

    full, full_grads = run(out)
    reduced, reduced_grads = run(teacher)
    torch.testing.assert_close(reduced.total, full.total, rtol=1e-5, atol=1e-6)  # type: ignore[attr-defined]
    for name in ("ce", "tv", "bce", "distill", "acceptance"):
        assert getattr(reduced, name) == pytest.approx(getattr(full, name), rel=1e-5, abs=1e-6)
    assert len(full_grads) == len(reduced_grads) > 0
    for a, b in zip(full_grads, reduced_grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    # The outside mass is kept: the reduced probabilities sum to less than one.
    assert float(teacher.log_probs.exp().sum(-1).max()) < 1.0


def test_reduced_teacher_rejects_a_mismatched_vocabulary(tiny_model: TinyTarget) -> None:
    d = make_drafter(RecomputeTarget(tiny_model))
    ids = torch.randint(0, 32, (1, 14), generator=torch.Generator().manual_seed(0))
    out = tiny_model.score(ids, [0, 1])
    teacher = DraftVocabTeacher.from_target(out, torch.tensor(SHORTLIST))
    rows, anchors = torch.tensor([0]), torch.tensor([6])
    with pytest.raises(ValueError, match="target_out"):
        dspark_loss(d, ids, teacher, rows, anchors)  # the drafter drafts the full vocabulary
    other = d.restrict_vocab(SHORTLIST[::-1])
    with pytest.raises(ValueError, match="target_out"):
        dspark_loss(other, ids, teacher, rows, anchors)
    with pytest.raises(ValueError, match="draft_vocab_ids"):
        DraftVocabTeacher.from_target(out, torch.tensor([], dtype=torch.int64))
    with pytest.raises(ValueError, match="draft_vocab_ids"):
        DraftVocabTeacher(out.features, teacher.log_probs, torch.tensor([1, 2]))


class SameOutputTarget:
    """The tiny target, returning the very same output object for a repeated batch (as the
    recipe's caching target does), so that the trainer reduces it once."""

    def __init__(self, model: TinyTarget) -> None:
        self.model = model
        self.hidden_size, self.vocab_size = model.hidden_size, model.vocab_size
        self.num_layers = model.num_layers
        self.last: tuple[torch.Tensor, TargetOutput] | None = None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden)

    def score(self, ids: torch.Tensor, layer_ids: list[int]) -> TargetOutput:
        if self.last is None or not torch.equal(self.last[0], ids):
            self.last = (ids.clone(), self.model.score(ids, layer_ids))
        return self.last[1]


def test_training_a_restricted_drafter_is_the_same_with_a_caching_target(
    tiny_model: TinyTarget,
) -> None:
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 32, (14,), generator=gen).tolist() for _ in range(4)]
    data = [s for s in seqs for _ in range(2)]  # each sequence twice in a row: batch size 1
    train = TrainConfig(
        steps=8,
        batch_size=1,
        anchors_per_sequence=3,
        max_seq_len=14,
        warmup_steps=0,
        log_every=4,
        progress=False,
        standardize_features=False,
    )

    def trained(target: object) -> list[torch.Tensor]:
        d = make_drafter(RecomputeTarget(tiny_model)).restrict_vocab(list(range(0, 32, 2)))
        result = train_drafter(target, data, None, train, drafter=d)  # type: ignore[arg-type]
        assert result.step == 8 and all(h["loss"] == h["loss"] for h in result.history)
        return [p.detach().clone() for p in result.drafter.parameters()]

    plain, cached = trained(tiny_model), trained(SameOutputTarget(tiny_model))
    for a, b in zip(plain, cached):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    start = make_drafter(RecomputeTarget(tiny_model)).restrict_vocab(list(range(0, 32, 2)))
    assert any(not torch.equal(a, p) for a, p in zip(plain, start.parameters()))
