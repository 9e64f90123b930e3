"""PrefixScheduler (Algorithm 1): bounds, prefix closure, early stop against a literal loop."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_spec.scheduling import (
    FixedGammaScheduler,
    PrefixScheduler,
    SPSCurve,
    ThresholdScheduler,
    VerifyScheduler,
    evaluate_schedule,
)
from deepinfer_spec.scheduling.prefix import MIN_RELATIVE_GAIN

ROOF = SPSCurve.roofline(weight_read_s=4e-3, per_token_s=60e-6)
STEEP = SPSCurve.roofline(weight_read_s=1e-3, per_token_s=1e-3)
CURVES = [SPSCurve.flat(), ROOF, STEEP, SPSCurve.roofline(2e-3, 1e-4, overlap=1.0)]


def _brute_force(conf: torch.Tensor, sps: SPSCurve) -> tuple[list[int], int]:
    """Algorithm 1 written as the paper's loop, one admission at a time in plain Python (with
    the scheduler's stated margin: a gain within rounding of zero is not a gain)."""
    r, g = conf.shape
    a = [[1.0] * g for _ in range(r)]
    for i in range(r):
        run = 1.0
        for j in range(g):
            run *= float(conf[i, j])
            a[i][j] = run
    cands = sorted((-a[i][j], i, j) for i in range(r) for j in range(g))
    counts, tau, batch = [0] * r, float(r), r
    best = tau * sps.at(batch)
    admitted = 0
    for neg_a, i, _j in cands:
        new = (tau - neg_a) * sps.at(batch + 1)
        if new <= best * (1 + MIN_RELATIVE_GAIN):
            break
        tau, batch, best = tau - neg_a, batch + 1, new
        counts[i] += 1
        admitted += 1
    return counts, admitted


confidences = st.integers(1, 10).flatmap(
    lambda r: st.integers(1, 6).flatmap(
        lambda g: st.lists(
            st.sampled_from([0.0, 0.05, 0.3, 0.5, 0.5, 0.8, 0.9, 0.97, 1.0]) | st.floats(0.0, 1.0),
            min_size=r * g,
            max_size=r * g,
        ).map(lambda v: torch.tensor(v, dtype=torch.float64).reshape(r, g))
    )
)


@settings(max_examples=60)
@given(confidences, st.sampled_from(range(len(CURVES))))
def test_matches_literal_loop_and_invariants(conf: torch.Tensor, curve: int) -> None:
    sps = CURVES[curve]
    plan = PrefixScheduler(sps).plan(conf)
    n = plan.num_draft_tokens
    r, g = conf.shape
    assert n.dtype == torch.int64 and n.shape == (r,)
    assert ((n >= 0) & (n <= g)).all()
    expected, admitted = _brute_force(conf, sps)
    assert n.tolist() == expected
    assert plan.batch_size == r + admitted == r + int(n.sum())
    again = evaluate_schedule(conf, n, sps)
    assert plan.expected_tau == pytest.approx(again.expected_tau)
    assert plan.expected_throughput == pytest.approx(again.expected_throughput)


def test_a_rounding_level_gain_is_not_admitted() -> None:
    """Hypothesis found this: on a flat curve, a second draft of survival 2e-16 after one of
    0.9 adds less than an ulp of ``1.9``; the vectorised and the running sums rounded it
    differently, so the scheduler admitted it and the literal loop did not."""
    conf = torch.tensor([[0.9, 2.220446049250313e-16]], dtype=torch.float64)
    sps = SPSCurve.flat()
    assert PrefixScheduler(sps).schedule(conf).tolist() == [1] == _brute_force(conf, sps)[0]


@settings(max_examples=60)
@given(confidences, st.sampled_from(range(len(CURVES))))
def test_prefix_closed_and_early_stop(conf: torch.Tensor, curve: int) -> None:
    sps = CURVES[curve]
    plan = PrefixScheduler(sps).plan(conf)
    n = plan.num_draft_tokens
    a = torch.cumprod(conf, dim=1)
    g = conf.shape[1]
    # Prefix closure: the verified set of row i is exactly {1..n_i}; every admitted survival
    # is >= every unadmitted one (greedy by survival).
    admitted = torch.arange(g).unsqueeze(0) < n.unsqueeze(1)
    if admitted.any() and (~admitted).any():
        assert a[admitted].min() >= a[~admitted].max()
    # Early stop: the best unadmitted candidate would not raise throughput.
    if (~admitted).any():
        nxt = float(a[~admitted].max())
        new = (plan.expected_tau + nxt) * sps.at(plan.batch_size + 1)
        assert new <= plan.expected_throughput * (1 + 1e-12)


@settings(max_examples=30)
@given(confidences)
def test_flat_curve_verifies_everything_with_positive_confidence(conf: torch.Tensor) -> None:
    conf = conf.clamp(min=0.01)
    n = PrefixScheduler(SPSCurve.flat()).schedule(conf)
    assert (n == conf.shape[1]).all()


def test_steeper_curve_verifies_less() -> None:
    gen = torch.Generator().manual_seed(0)
    conf = torch.sigmoid(torch.randn(64, 5, generator=gen) + 1.5)
    flat = int(PrefixScheduler(SPSCurve.flat()).schedule(conf).sum())
    roof = int(PrefixScheduler(ROOF).schedule(conf).sum())
    steep = int(PrefixScheduler(STEEP).schedule(conf).sum())
    assert flat == 64 * 5
    assert steep < roof < flat


def test_load_lowers_drafts_per_request() -> None:
    gen = torch.Generator().manual_seed(1)
    conf = torch.sigmoid(torch.randn(128, 5, generator=gen) + 1.5)
    light = PrefixScheduler(ROOF).schedule(conf[:1]).float().mean()
    heavy = PrefixScheduler(ROOF).schedule(conf).float().mean()
    assert light == 5 and heavy < 4


def test_beats_or_matches_baselines_in_expected_throughput() -> None:
    gen = torch.Generator().manual_seed(2)
    conf = torch.sigmoid(torch.randn(48, 5, generator=gen) + 1.0)
    best = PrefixScheduler(ROOF).plan(conf).expected_throughput
    for sched in (FixedGammaScheduler(5), FixedGammaScheduler(1), ThresholdScheduler(0.5)):
        assert best >= evaluate_schedule(conf, sched.schedule(conf), ROOF).expected_throughput


def test_max_batch_size_caps_and_edge_cases() -> None:
    conf = torch.full((4, 5), 0.9)
    plan = PrefixScheduler(SPSCurve.flat(), max_batch_size=10).plan(conf)
    assert plan.batch_size == 10 and int(plan.num_draft_tokens.sum()) == 6
    assert PrefixScheduler(SPSCurve.flat(), max_batch_size=2).plan(conf).batch_size == 4
    empty = PrefixScheduler(ROOF).plan(torch.zeros(0, 5))
    assert empty.num_draft_tokens.shape == (0,) and empty.batch_size == 0
    zeros = PrefixScheduler(SPSCurve.flat()).schedule(torch.zeros(3, 5))
    assert zeros.tolist() == [0, 0, 0]
    assert isinstance(PrefixScheduler(ROOF), VerifyScheduler)


def test_input_errors() -> None:
    sched = PrefixScheduler(ROOF)
    with pytest.raises(ValueError, match=r"\[R, G\]"):
        sched.schedule(torch.rand(5))
    with pytest.raises(ValueError, match="probabilities"):
        sched.schedule(torch.full((2, 2), float("nan")))
    with pytest.raises(TypeError, match="floating"):
        sched.schedule(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match="SPSCurve"):
        PrefixScheduler(lambda b: 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_draft_tokens"):
        evaluate_schedule(torch.rand(2, 3), torch.tensor([4, 0]), ROOF)
