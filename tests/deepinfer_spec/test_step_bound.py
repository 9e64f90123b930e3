"""Drawing only the draft positions a step can verify (``BoundedScheduler``, ``propose``'s
``num_tokens``): the bound never cuts a draft the scheduler would verify, and the drawn
positions equal the full proposal's."""

from __future__ import annotations

import pytest
import torch
from conftest import make_drafter
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_spec import (
    FixedGammaScheduler,
    PrefixScheduler,
    RecomputeTarget,
    SPSCurve,
    ThresholdScheduler,
    draft_block,
    draft_bound,
    propose,
)


def _context(drafter, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    window = drafter.config.window
    context = torch.randn(batch, window, drafter.hidden_size, generator=gen)
    return context, torch.ones(batch, window, dtype=torch.bool)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_fewer_positions_equal_the_full_proposal(
    target: RecomputeTarget, temperature: float
) -> None:
    drafter = make_drafter(target)
    gamma = drafter.config.gamma
    anchors = torch.tensor([1, 5, 9])
    context, valid = _context(drafter, 3)
    full = propose(
        drafter,
        anchors,
        context,
        valid,
        temperature=temperature,
        generator=torch.Generator().manual_seed(3),
    )
    for m in range(1, gamma + 1):
        part = propose(
            drafter,
            anchors,
            context,
            valid,
            temperature=temperature,
            generator=torch.Generator().manual_seed(3),
            num_tokens=m,
        )
        assert part.token_ids.shape == (3, m)
        assert torch.equal(part.token_ids, full.token_ids[:, :m])
        torch.testing.assert_close(part.probs, full.probs[:, :m])
        torch.testing.assert_close(part.confidence, full.confidence[:, :m])
    for bad in (0, gamma + 1, 1.5, True):
        with pytest.raises(ValueError, match="num_tokens"):
            propose(drafter, anchors, context, valid, num_tokens=bad)  # type: ignore[arg-type]


def test_bounds_of_the_schedulers() -> None:
    assert draft_bound(FixedGammaScheduler(2), 4, 5) == 2
    assert draft_bound(FixedGammaScheduler(9), 4, 5) == 5
    assert draft_bound(ThresholdScheduler(0.5), 4, 5) == 5  # no bound: every position
    flat = SPSCurve.flat(100.0)
    assert draft_bound(PrefixScheduler(flat), 1, 5) == 5
    # A CPU-like curve: 2 tokens cost 1.05x one, 4 tokens 2.2x, 6 tokens 3.7x.
    cpu = SPSCurve([1, 2, 4, 6], [1.0, 1 / 1.05, 1 / 2.2, 1 / 3.7])
    bound = draft_bound(PrefixScheduler(cpu), 1, 5)
    assert 1 <= bound < 5
    assert draft_bound(PrefixScheduler(flat, max_batch_size=3), 1, 5) == 2
    assert draft_bound(PrefixScheduler(flat), 0, 5) == 0


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    times=st.lists(st.floats(1e-3, 1.0), min_size=2, max_size=6),
    conf=st.lists(st.floats(0.0, 1.0), min_size=20, max_size=20),
)
def test_prefix_bound_never_cuts_a_verified_draft(
    rows: int, times: list[float], conf: list[float]
) -> None:
    gamma = 5
    sizes = list(range(1, len(times) + 1))
    curve = SPSCurve(sizes, [1.0 / t for t in times])
    scheduler = PrefixScheduler(curve)
    c = torch.tensor(conf[: rows * gamma]).reshape(rows, gamma)
    plan = scheduler.plan(c)
    bound = scheduler.max_drafts(rows, gamma)
    assert int(plan.num_draft_tokens.max()) <= bound
    assert int(plan.num_draft_tokens.sum()) <= max(bound, 0) or bound == gamma
    # All-certain drafts reach the bound's total (it is tight for survival 1).
    sure = scheduler.plan(torch.ones(rows, gamma))
    assert int(sure.num_draft_tokens.max()) <= bound


def test_draft_block_with_a_bound_verifies_what_the_full_block_would(
    target: RecomputeTarget,
) -> None:
    drafter = make_drafter(target)
    anchors = torch.tensor([2, 4])
    context, valid = _context(drafter, 2, seed=1)
    cpu = SPSCurve([1, 2, 3, 4, 6], [1.0, 1 / 1.05, 1 / 1.6, 1 / 2.2, 1 / 3.7])

    class Unbounded:  # the same scheduler without its bound
        def schedule(self, confidence: torch.Tensor) -> torch.Tensor:
            return PrefixScheduler(cpu).schedule(confidence)

    bounded = draft_block(drafter, anchors, context, valid, [0.0, 0.0], PrefixScheduler(cpu))
    full = draft_block(drafter, anchors, context, valid, [0.0, 0.0], Unbounded())
    assert torch.equal(bounded.num_draft_tokens, full.num_draft_tokens)
    for row in range(2):
        assert bounded.drafts(row) == full.drafts(row)
