"""The shared DSpark step (``deepinfer_spec.step``): draft_block and verify_block."""

from __future__ import annotations

import pytest
import torch
from conftest import make_drafter
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels import greedy_verify
from deepinfer_spec import (
    DraftBlock,
    FixedGammaScheduler,
    RecomputeTarget,
    apply_temperatures,
    draft_block,
    propose,
    verify_block,
)


def _context(drafter, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    window = drafter.config.window
    context = torch.randn(batch, window, drafter.hidden_size, generator=gen)
    valid = torch.ones(batch, window, dtype=torch.bool)
    return context, valid


def test_draft_block_calibrates_schedules_and_caps(target: RecomputeTarget) -> None:
    drafter = make_drafter(target)
    gamma = drafter.config.gamma
    anchors = torch.tensor([1, 2, 3])
    context, valid = _context(drafter, 3)
    sts = torch.tensor([0.5, 2.0, 3.0, 4.0])
    block = draft_block(
        drafter,
        anchors,
        context,
        valid,
        [0.0, 0.0, 0.0],
        FixedGammaScheduler(3),
        sts_greedy=sts,
        max_drafts=[5, 1, 0],
    )
    raw = propose(drafter, anchors, context, valid, temperature=0.0)
    # FixedGammaScheduler(3) can never verify a 4th draft: only 3 positions are drawn.
    assert torch.equal(block.token_ids[:, :3], raw.token_ids[:, :3])
    assert not block.token_ids[:, 3:].any() and not block.confidence[:, 3:].any()
    torch.testing.assert_close(
        block.confidence[:, :3], apply_temperatures(raw.confidence, sts)[:, :3]
    )
    assert block.num_draft_tokens.tolist() == [3, 1, 0]  # scheduled 3, capped per row
    assert block.probs is None and block.width == 4
    assert block.drafts(1) == raw.token_ids[1, :1].tolist() and block.drafts(2) == []
    with pytest.raises(ValueError, match="temperatures"):
        draft_block(drafter, anchors, context, valid, [0.0], FixedGammaScheduler(gamma))
    with pytest.raises(ValueError, match="max_drafts"):
        draft_block(
            drafter, anchors, context, valid, [0.0] * 3, FixedGammaScheduler(1), max_drafts=[1]
        )


def test_draft_block_groups_rows_by_temperature(target: RecomputeTarget) -> None:
    drafter = make_drafter(target)
    anchors = torch.tensor([4, 5])
    context, valid = _context(drafter, 2, seed=1)
    block = draft_block(
        drafter,
        anchors,
        context,
        valid,
        [0.0, 0.8],
        FixedGammaScheduler(2),
        generator=torch.Generator().manual_seed(0),
    )
    greedy = propose(drafter, anchors[:1], context[:1], valid[:1], temperature=0.0)
    # FixedGammaScheduler(2): only the first two positions are drawn.
    assert torch.equal(block.token_ids[0, :2], greedy.token_ids[0, :2])
    assert block.probs is not None
    assert bool((block.probs[0] == 0).all())  # greedy rows keep no draft distribution
    torch.testing.assert_close(block.probs[1, :2].sum(-1), torch.ones(2))
    assert not block.probs[1, 2:].any()


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 1000),
    n=st.lists(st.integers(0, 4), min_size=1, max_size=4),
)
def test_verify_block_greedy_matches_the_kernel_and_ignores_dead_positions(
    seed: int, n: list[int]
) -> None:
    """Positions past a row's drafts may hold anything (even NaN): the verdict is the greedy
    kernel's on the live positions."""
    gen = torch.Generator().manual_seed(seed)
    batch, gamma, vocab = len(n), 4, 11
    tokens = torch.randint(0, vocab, (batch, gamma), generator=gen)
    block = DraftBlock(tokens, torch.rand(batch, gamma), torch.tensor(n), None)
    width = block.width
    logits = torch.randn(batch, width, vocab, generator=gen)
    # Make some drafts the argmax so that rows accept a few.
    for b in range(batch):
        for j in range(min(n[b], width - 1)):
            if (seed + b + j) % 2 == 0:
                logits[b, j, tokens[b, j]] = 10.0
    expected = greedy_verify(tokens[:, : width - 1], logits, torch.tensor(n))
    dead = torch.arange(width)[None, :] > torch.tensor(n)[:, None]
    poisoned = logits.masked_fill(dead[..., None], float("nan"))
    verdict = verify_block(block, poisoned, [0.0] * batch)
    assert torch.equal(verdict.output_ids, expected.output_ids)
    assert torch.equal(verdict.num_accepted, expected.num_accepted)
    for b in range(batch):
        assert verdict.tokens(b) == expected.output_ids[b, : int(expected.num_emitted[b])].tolist()


def test_verify_block_rejects_bad_operands() -> None:
    block = DraftBlock(
        torch.zeros(2, 3, dtype=torch.int64), torch.rand(2, 3), torch.tensor([1, 2]), None
    )
    with pytest.raises(ValueError, match="logits"):
        verify_block(block, torch.zeros(2, 2, 5), [0.0, 0.0])
    with pytest.raises(ValueError, match="temperatures"):
        verify_block(block, torch.zeros(2, 3, 5), [0.0])
    with pytest.raises(ValueError, match="probs"):
        verify_block(block, torch.zeros(2, 3, 5), [0.0, 1.0])
