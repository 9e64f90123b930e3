"""Draft vocabularies: ``restrict_vocab``, drafting, the loss and checkpoints over a shortlist."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import RaggedScheduler, make_drafter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer_spec import DSparkConfig, RecomputeTarget, SpecDecoder, propose
from deepinfer_spec.testing import TinyTarget
from deepinfer_spec.training import (
    dspark_loss,
    frequent_tokens,
    load_drafter,
    save_drafter,
)

SHORTLIST = [7, 3, 30, 12, 0, 21, 5, 18, 9, 26, 14, 1]


def _inputs(batch: int, width: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    anchors = torch.randint(0, 32, (batch,), generator=g)
    context = torch.randn(batch, width, 32, generator=g)
    valid = torch.ones(batch, width, dtype=torch.bool)
    return anchors, context, valid


def test_restricted_drafter_keeps_the_full_logits_of_its_tokens(target: RecomputeTarget) -> None:
    full = make_drafter(target)
    short = full.restrict_vocab(SHORTLIST)
    assert short.config.draft_vocab_size == len(SHORTLIST) and short.draft_vocab_size == 12
    assert full.draft_vocab_ids is None and short.draft_vocab_ids.tolist() == SHORTLIST
    anchors, context, valid = _inputs(3, 8, 0)
    hidden = full.backbone(anchors, context, valid)
    torch.testing.assert_close(short.backbone(anchors, context, valid), hidden)
    prev = torch.randint(0, 32, (3, 4), generator=torch.Generator().manual_seed(1))
    logits_full, conf_full = full.teacher_forced(hidden, prev)
    logits_short, conf_short = short.teacher_forced(hidden, prev)
    torch.testing.assert_close(logits_short, logits_full[..., SHORTLIST])
    torch.testing.assert_close(conf_short, conf_full)
    # Restricting again narrows within the current shortlist; ids outside it are refused.
    narrower = short.restrict_vocab([21, 7])
    torch.testing.assert_close(narrower.teacher_forced(hidden, prev)[0], logits_full[..., [21, 7]])
    with pytest.raises(ValueError, match="outside the current draft vocabulary"):
        short.restrict_vocab([2])


@pytest.mark.parametrize(
    ("ids", "match"),
    [([], "non-empty"), ([3, 3], "duplicates"), ([40], r"\[0, 32\)"), ([[1, 2]], "1-D")],
)
def test_restrict_vocab_rejects_bad_ids(target: RecomputeTarget, ids: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_drafter(target).restrict_vocab(ids)  # type: ignore[arg-type]


def test_config_rejects_a_draft_vocabulary_larger_than_the_target(target: RecomputeTarget) -> None:
    with pytest.raises(ValueError, match="draft_vocab_size"):
        DSparkConfig(target_layer_ids=(0,), draft_vocab_size=0)
    with pytest.raises(ValueError, match="exceeds"):
        make_drafter(target, draft_vocab_size=33)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**16), temperature=st.sampled_from([0.0, 0.7, 1.0]))
def test_propose_draws_only_shortlisted_tokens_from_exact_distributions(
    target: RecomputeTarget, seed: int, temperature: float
) -> None:
    full = make_drafter(target, seed=seed % 7)
    short = full.restrict_vocab(SHORTLIST)
    anchors, context, valid = _inputs(4, 8, seed)
    gen = torch.Generator().manual_seed(seed)
    d = propose(short, anchors, context, valid, temperature=temperature, generator=gen)
    assert set(d.token_ids.flatten().tolist()) <= set(SHORTLIST)
    outside = torch.ones(32, dtype=torch.bool)
    outside[SHORTLIST] = False
    assert d.probs.shape == (4, 4, 32) and float(d.probs[..., outside].abs().max()) == 0.0
    torch.testing.assert_close(d.probs.sum(-1), torch.ones(4, 4))
    # The distribution each token came from is the full drafter's, renormalised on the list.
    hidden = full.backbone(anchors, context, valid)
    prev = torch.cat((anchors[:, None], d.token_ids[:, :-1]), 1)
    logits = full.teacher_forced(hidden, prev)[0][..., SHORTLIST]
    if temperature == 0:
        best = torch.tensor(SHORTLIST)[logits.argmax(-1)]
        assert torch.equal(d.token_ids, best)
    else:
        expect = torch.softmax(logits / temperature, -1)
        torch.testing.assert_close(d.probs[..., SHORTLIST], expect, rtol=1e-5, atol=1e-6)
    assert bool((d.probs.gather(-1, d.token_ids[..., None]) > 0).all())


def test_loss_over_a_shortlist_matches_its_definition(tiny_model: TinyTarget) -> None:
    target = RecomputeTarget(tiny_model)
    d = make_drafter(target).restrict_vocab(SHORTLIST)
    ids = torch.tensor([[7, 3, 30, 2, 12, 0, 31, 21, 5, 18, 9, 26, 4, 14]])
    out = tiny_model.score(ids, [0, 1])
    terms = dspark_loss(d, ids, out, torch.tensor([0]), torch.tensor([9]))
    ctx = d.project_context(out.features[:, 1:9])
    h = d.backbone(ids[:, 9], ctx, torch.ones(1, 8, dtype=torch.bool))
    logits, conf = d.teacher_forced(h, ids[:, 9:13])
    p_d = torch.softmax(logits, -1)[0]  # over the shortlist
    p_t = torch.softmax(out.logits[0, 9:13], -1)
    full_p_d = torch.zeros(4, 32)
    full_p_d[:, SHORTLIST] = p_d
    tv = 0.5 * (full_p_d - p_t).abs().sum(-1)  # TV between the two full distributions
    labels = ids[0, 10:14].tolist()  # 9, 26, 4, 14: token 4 is not on the shortlist
    ce = torch.stack(
        [
            -torch.log(p_d[k, SHORTLIST.index(t)]) if t in SHORTLIST else torch.tensor(0.0)
            for k, t in enumerate(labels)
        ]
    )
    bce = F.binary_cross_entropy_with_logits(conf[0], 1 - tv, reduction="none")
    w = torch.exp(-torch.arange(4.0) / 4)
    total = ((0.1 * ce + 0.9 * tv + bce) * w).sum() / w.sum()
    torch.testing.assert_close(terms.total, total, rtol=1e-5, atol=1e-6)
    assert bool(torch.isfinite(terms.total))


def test_restricted_checkpoint_round_trips(tiny_model: TinyTarget, tmp_path: object) -> None:
    target = RecomputeTarget(tiny_model)
    short = make_drafter(target).restrict_vocab(SHORTLIST)
    save_drafter(short, tmp_path)  # type: ignore[arg-type]
    loaded = load_drafter(tmp_path, tiny_model)  # type: ignore[arg-type]
    assert loaded.draft_vocab_ids.tolist() == SHORTLIST
    anchors, context, valid = _inputs(2, 8, 3)
    a = propose(short, anchors, context, valid, temperature=0)
    b = propose(loaded, anchors, context, valid, temperature=0)
    assert torch.equal(a.token_ids, b.token_ids)


def test_greedy_decoding_with_a_shortlist_stays_exact(tiny_model: TinyTarget) -> None:
    target = RecomputeTarget(tiny_model)
    short = make_drafter(target, seed=2).restrict_vocab(SHORTLIST[:5])
    decoder = SpecDecoder(short, target, RaggedScheduler(0.0), max_requests=8, temperature=0)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 32, (n,), generator=g).tolist() for n in (1, 4, 9, 13)]
    for prompt, got in zip(prompts, decoder.generate(prompts, max_new_tokens=12)):
        assert got == tiny_model.greedy(prompt, 12)


def test_frequent_tokens_ranks_by_count_with_forced_ids_first() -> None:
    data = [[5, 5, 5, 2, 2, 9], torch.tensor([2, 7, 5, 5])]
    assert frequent_tokens(data, 10, 3).tolist() == [5, 2, 7]  # 7 and 9 tie: lower id first
    assert frequent_tokens(data, 10, 3, always=[9, 9]).tolist() == [9, 5, 2]
    assert frequent_tokens(data, 10, 20).numel() == 10  # capped at the vocabulary
    with pytest.raises(ValueError, match="size"):
        frequent_tokens(data, 10, 0)
    with pytest.raises(ValueError, match="data"):
        frequent_tokens([[12]], 10, 3)
    with pytest.raises(ValueError, match="always"):
        frequent_tokens(data, 10, 3, always=[10])


def test_a_drafter_restricted_under_inference_mode_still_drafts(target: RecomputeTarget) -> None:
    full = make_drafter(target)
    anchors, context, valid = _inputs(2, 8, 5)
    with torch.inference_mode():  # its draft_vocab buffer is then an inference tensor
        short = full.restrict_vocab(SHORTLIST)
        d = propose(short, anchors, context, valid, temperature=0)
    assert set(d.token_ids.flatten().tolist()) <= set(SHORTLIST)
