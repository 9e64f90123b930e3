"""`load_checkpoint` and `choose_policy`: what a serving stack needs to build a speculator."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from conftest import make_drafter

from deepinfer_spec import (
    DraftGate,
    FixedGammaScheduler,
    PrefixScheduler,
    SPSCurve,
    choose_policy,
    module_linear,
)
from deepinfer_spec.policy import GATE_BATCH_SIZES, PROFILE_BATCH_SIZES
from deepinfer_spec.training import load_checkpoint, save_drafter


def test_load_checkpoint_returns_the_drafter_cast_and_its_temperatures(
    target, tmp_path: Path
) -> None:
    drafter = make_drafter(target)
    save_drafter(drafter, tmp_path)
    plain, sts = load_checkpoint(tmp_path, target)
    assert sts == {}  # no sts.json: no temperatures
    for (name, a), (_, b) in zip(drafter.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name
    (tmp_path / "sts.json").write_text(json.dumps({"greedy": [1.0, 2.0], "other": [3.0]}))
    half, sts = load_checkpoint(tmp_path, target, dtype=torch.bfloat16)
    assert half.context_proj.weight.dtype == torch.bfloat16
    assert set(sts) == {"greedy"} and sts["greedy"].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"directory: .*no config\.json"):
        load_checkpoint(tmp_path / "missing", target)


class _Profiler:
    """A target profiler with a known curve (or none), recording the sizes it was asked for."""

    def __init__(self, steps_per_s: float | None = 1e9) -> None:
        self.steps_per_s = steps_per_s
        self.asked: list[tuple[int, ...]] = []

    def __call__(self, sizes: Sequence[int]) -> SPSCurve | None:
        self.asked.append(tuple(sizes))
        if self.steps_per_s is None:
            return None
        return SPSCurve(list(sizes), [self.steps_per_s / b for b in sizes])


def test_fixed_count_or_given_scheduler_needs_no_curve_unless_the_gate_is_priced(target) -> None:
    drafter = make_drafter(target)
    profiler = _Profiler()
    scheduler, gate = choose_policy(drafter, profiler, num_speculative_tokens=3, gate=None)
    assert isinstance(scheduler, FixedGammaScheduler) and gate is None and profiler.asked == []
    mine, configured = FixedGammaScheduler(2), DraftGate(min_accepted=0.5)
    scheduler, gate = choose_policy(drafter, profiler, scheduler=mine, num_speculative_tokens=3)
    # The default gate is priced over the 1- and 2-token steps only.
    assert scheduler is mine and profiler.asked == [GATE_BATCH_SIZES]
    assert isinstance(gate, DraftGate) and gate.break_even_accepted is not None
    assert choose_policy(drafter, profiler, scheduler=mine, gate=configured) == (mine, configured)


def test_prefix_scheduler_over_the_profiled_curve_prices_the_gate_once(target) -> None:
    profiler = _Profiler()
    scheduler, gate = choose_policy(make_drafter(target), profiler)
    assert isinstance(scheduler, PrefixScheduler) and profiler.asked == [PROFILE_BATCH_SIZES]
    # Priced: a break-even number of accepted drafts from the drafter's time and the curve.
    assert isinstance(gate, DraftGate) and gate.break_even_accepted is not None


def test_a_target_that_cannot_be_timed(target) -> None:
    drafter = make_drafter(target)
    # The gate falls back to the unpriced one...
    _, gate = choose_policy(drafter, _Profiler(None), scheduler=FixedGammaScheduler(1))
    assert isinstance(gate, DraftGate) and gate.break_even_accepted is None
    # ...the prefix scheduler has nothing to run over.
    with pytest.raises(ValueError, match="profile_target"):
        choose_policy(drafter, _Profiler(None))
    with pytest.raises(ValueError, match="gate"):
        choose_policy(drafter, _Profiler(), scheduler=FixedGammaScheduler(1), gate="always")


def test_linears_replace_only_the_modules_own_product(target) -> None:
    def slow(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return layer(x.clone().clone())  # same values, more work

    def chosen(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        return layer(x)

    drafter = make_drafter(target)
    assert drafter.linear is module_linear
    choose_policy(drafter, _Profiler(), scheduler=FixedGammaScheduler(1), gate=None, linears=[slow])
    assert drafter.linear in (slow, module_linear)  # whichever proposed faster here
    drafter.use_linear(chosen)
    choose_policy(drafter, _Profiler(), scheduler=FixedGammaScheduler(1), gate=None, linears=[slow])
    assert drafter.linear is chosen  # a product the caller chose is kept
