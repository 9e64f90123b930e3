"""DSparkConfig validation, DSparkDrafter heads and propose()'s exact distributions."""

from __future__ import annotations

import pytest
import torch
from conftest import make_drafter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer_spec import DSparkConfig, DSparkDrafter, RecomputeTarget, propose
from deepinfer_spec.layers import RopeTables


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target_layer_ids": ()}, "target_layer_ids"),
        ({"target_layer_ids": (0, 0)}, "duplicates"),
        ({"target_layer_ids": (-1,)}, "target_layer_ids"),
        ({"target_layer_ids": (0,), "gamma": 0}, "gamma"),
        ({"target_layer_ids": (0,), "window": -3}, "window"),
        ({"target_layer_ids": (0,), "num_layers": 0}, "num_layers"),
        ({"target_layer_ids": (0,), "markov_rank": 0}, "markov_rank"),
        ({"target_layer_ids": (0,), "sequential_head": "lstm"}, "sequential_head"),
        ({"target_layer_ids": (0,), "num_heads": 4, "num_kv_heads": 3}, "num_kv_heads"),
        ({"target_layer_ids": (0,), "rope_theta": 0.0}, "rope_theta"),
        ({"target_layer_ids": (0,), "gamma": 2.5}, "gamma"),
    ],
)
def test_invalid_configs_raise(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DSparkConfig(**kwargs)  # type: ignore[arg-type]


def test_config_round_trips_through_dict() -> None:
    cfg = DSparkConfig(target_layer_ids=(1, 0), gamma=3, sequential_head="rnn")
    assert DSparkConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown"):
        DSparkConfig.from_dict({**cfg.to_dict(), "bogus": 1})


def test_drafter_rejects_layers_and_shapes_the_target_lacks(target: RecomputeTarget) -> None:
    with pytest.raises(ValueError, match="out of range"):
        DSparkDrafter(DSparkConfig(target_layer_ids=(2,)), target)
    with pytest.raises(ValueError, match="heads"):
        DSparkDrafter(DSparkConfig(target_layer_ids=(0,), num_heads=5), target)
    d = make_drafter(target)
    with pytest.raises(ValueError, match="features"):
        d.project_context(torch.zeros(2, 3, 32))
    ctx = torch.zeros(2, 4, 32)
    with pytest.raises(ValueError, match="context_valid"):
        d.backbone(torch.tensor([1, 2]), ctx, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="exceed window"):
        d.backbone(torch.tensor([1, 2]), torch.zeros(2, 9, 32), torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="context"):
        d.backbone(torch.tensor([1, 2]), torch.zeros(3, 4, 32), torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="anchor_ids"):
        propose(d, torch.tensor([1, 99]), ctx, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="temperature"):
        propose(d, torch.tensor([1, 2]), ctx, torch.ones(2, 4, dtype=torch.bool), temperature=-1)


def test_target_weights_are_borrowed_not_owned(target: RecomputeTarget) -> None:
    d = make_drafter(target)
    names = set(d.state_dict())
    assert not any(n.startswith(("model.", "_target", "tok", "head")) for n in names)
    assert "markov_in.weight" in names and "confidence_head.weight" in names
    assert d.feature_dim == 2 * 32


def _context(drafter: DSparkDrafter, batch: int, width: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(batch, width, drafter.feature_dim, generator=g)
    valid = torch.rand(batch, width, generator=g) < 0.8
    return drafter.project_context(raw).detach(), valid


@pytest.mark.parametrize("head", ["markov", "rnn"])
@settings(
    max_examples=10,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(temperature=st.sampled_from([0.5, 1.0, 1.7]), seed=st.integers(0, 2**16))
def test_probs_are_exactly_the_sampling_distribution(
    target: RecomputeTarget, head: str, temperature: float, seed: int
) -> None:
    d = make_drafter(target, sequential_head=head)
    ctx, valid = _context(d, 3, 8, seed)
    anchors = torch.tensor([1, 5, 31])
    g = torch.Generator().manual_seed(seed)
    draft = propose(d, anchors, ctx, valid, temperature=temperature, generator=g)
    assert draft.token_ids.shape == (3, 4) and draft.probs.shape == (3, 4, 32)
    # Recompute independently: teacher forcing with the sampled tokens as the previous ones.
    with torch.no_grad():
        h = d.backbone(anchors, ctx, valid)
        prev = torch.cat((anchors[:, None], draft.token_ids[:, :-1]), dim=1)
        logits, conf_logit = d.teacher_forced(h, prev)
    expect = torch.softmax(logits.float() / temperature, dim=-1)
    torch.testing.assert_close(draft.probs, expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(draft.confidence, torch.sigmoid(conf_logit))
    assert bool((draft.probs.gather(2, draft.token_ids[..., None]) > 0).all())


def test_markov_confidence_uses_previous_token_code(target: RecomputeTarget) -> None:
    d = make_drafter(target)
    h = torch.randn(2, 32)
    prev = torch.tensor([3, 4])
    bias, code = d.sequential_step(prev, None)
    assert torch.equal(code, d.markov_in.weight[prev])
    torch.testing.assert_close(bias, d.markov_in.weight[prev] @ d.markov_out.weight.T)
    w = d.confidence_head.weight[0]
    manual = torch.cat((h, code), -1) @ w + d.confidence_head.bias
    torch.testing.assert_close(d.confidence_logit(h, code), manual)


def test_sampling_frequencies_follow_probs(target: RecomputeTarget) -> None:
    d = make_drafter(target)
    n = 4000
    ctx, valid = _context(d, 1, 8, 0)
    draft = propose(
        d,
        torch.full((n,), 7),
        ctx.expand(n, -1, -1),
        valid.expand(n, -1),
        generator=torch.Generator().manual_seed(1),
    )
    counts = torch.bincount(draft.token_ids[:, 0], minlength=32).float()
    p = draft.probs[0, 0]
    # Chi-square over the first position, where every row shares one distribution.
    keep = p * n >= 5
    stat = float((((counts - n * p) ** 2) / (n * p))[keep].sum())
    assert stat < 70.0  # chi2 99.9% quantile for <= 31 degrees of freedom is ~61.1


def test_greedy_takes_argmax_and_reports_one_hot(target: RecomputeTarget) -> None:
    d = make_drafter(target)
    ctx, valid = _context(d, 2, 8, 3)
    anchors = torch.tensor([2, 9])
    draft = propose(d, anchors, ctx, valid, temperature=0)
    with torch.no_grad():
        h = d.backbone(anchors, ctx, valid)
        logits, _ = d.teacher_forced(h, torch.cat((anchors[:, None], draft.token_ids[:, :-1]), 1))
    assert torch.equal(draft.token_ids, logits.argmax(-1))
    assert torch.equal(draft.probs.argmax(-1), draft.token_ids)
    assert torch.equal(draft.probs.sum(-1), torch.ones(2, 4))


def test_context_matters_and_padding_does_not(target: RecomputeTarget) -> None:
    d = make_drafter(target)
    ctx, _ = _context(d, 1, 8, 4)
    valid = torch.tensor([[False, False, False, True, True, True, True, True]])
    with torch.no_grad():
        h = d.backbone(torch.tensor([3]), ctx, valid)
        junk = ctx.clone()
        junk[:, :3] = 100.0
        assert torch.allclose(d.backbone(torch.tensor([3]), junk, valid), h, atol=1e-6)
        other = ctx.clone()
        other[:, -1] = -other[:, -1]
        assert not torch.allclose(d.backbone(torch.tensor([3]), other, valid), h, atol=1e-4)
        # An empty context (first token of a one-token prompt) is fine too.
        empty = d.backbone(torch.tensor([3]), ctx[:, :0], valid[:, :0])
    assert empty.shape == (1, 4, 32) and bool(torch.isfinite(empty).all())


def test_init_backbone_from_target_copies_layer_weights(target: RecomputeTarget) -> None:
    d = make_drafter(target, intermediate_size=64)
    d.init_backbone_from_target([1])
    src = target.model.layer_state_dict(1)  # type: ignore[attr-defined]
    for name, tensor in d.layers[0].state_dict().items():
        assert torch.equal(tensor, src[name])
    wrong = make_drafter(target)  # intermediate 128 != the target's 64
    with pytest.raises(ValueError, match="shape"):
        wrong.init_backbone_from_target([0])
    with pytest.raises(ValueError, match="layers"):
        d.init_backbone_from_target([0, 1])


def test_feature_standardisation_is_identity_until_fitted_then_exact(
    target: RecomputeTarget,
) -> None:
    d = make_drafter(target)
    dim = d.feature_dim
    gen = torch.Generator().manual_seed(3)
    # Two dimensions with a huge offset and spread, like a Llama residual stream's outliers.
    sample = torch.randn(200, dim, generator=gen)
    sample[:, 0] = sample[:, 0] * 300.0 + 900.0
    sample[:, 5] = 40.0  # constant: carries nothing, must not be divided by zero
    raw = d.project_context(sample)
    expect = d.context_norm(d.context_proj(sample))
    torch.testing.assert_close(raw, expect)
    d.fit_feature_stats(sample)
    mean, std = sample.mean(0), sample.std(0)
    std[5] = 1.0
    torch.testing.assert_close(
        d.project_context(sample), d.context_norm(d.context_proj((sample - mean) / std))
    )
    standardised = (sample - d.feature_shift) * d.feature_scale
    torch.testing.assert_close(standardised.mean(0), torch.zeros(dim), atol=1e-4, rtol=0)
    assert torch.isfinite(d.feature_scale).all() and float(d.feature_scale[5]) == 1.0
    # The statistics are state: saved and restored with the weights.
    assert {"feature_shift", "feature_scale"} <= set(d.state_dict())


@pytest.mark.parametrize(
    ("features", "match"),
    [
        (torch.zeros(10, 7), "last dimension"),
        (torch.zeros(1, 64), "at least 2 rows"),
        (torch.full((4, 64), float("nan")), "NaN"),
    ],
)
def test_fit_feature_stats_rejects_bad_samples(
    target: RecomputeTarget, features: torch.Tensor, match: str
) -> None:
    d = make_drafter(target)
    assert d.feature_dim == 64
    with pytest.raises(ValueError, match=match):
        d.fit_feature_stats(features)
    assert torch.equal(d.feature_scale, torch.ones(64))


@pytest.mark.parametrize("width", [1, 5, 8])
def test_cached_rope_tables_give_the_recomputed_rotation(
    target: RecomputeTarget, width: int
) -> None:
    d = make_drafter(target, num_layers=2)
    g = torch.Generator().manual_seed(width)
    anchors = torch.randint(0, 32, (3,), generator=g)
    context = torch.randn(3, width, 32, generator=g)
    valid = torch.rand(3, width, generator=g) > 0.3
    got = d.backbone(anchors, context, valid)
    # The same layers with the rotation recomputed from the positions.
    gamma = d.config.gamma
    x = torch.cat((d.target.embed(anchors)[:, None], d.mask_embed[None].expand(3, -1, -1)), 1)
    q_pos = torch.arange(gamma)
    k_pos = torch.cat((torch.arange(-width, 0), q_pos))
    mask = torch.cat((valid, torch.ones(3, gamma, dtype=torch.bool)), 1)[:, None, None, :]
    rope = RopeTables.at(q_pos, k_pos, d.layers[0].head_dim, d.config.rope_theta)
    for layer in d.layers:
        x = layer(x, context, mask, rope)
    torch.testing.assert_close(got, x, rtol=0, atol=0)
