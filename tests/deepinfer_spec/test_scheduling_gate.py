"""``DraftGate``: pauses drafting when drafts are not accepted, probes, resumes, validates."""

from __future__ import annotations

import pytest

from deepinfer_spec import DraftGate


def _steps(gate: DraftGate, n: int) -> list[bool]:
    return [gate.should_draft() for _ in range(n)]


def test_open_until_warmup_then_closes_on_zero_acceptance() -> None:
    gate = DraftGate(min_accepted=0.25, probe_every=4, warmup_rows=8)
    for _ in range(3):
        assert gate.should_draft()
        gate.record(num_rows=2, num_accepted=0)
    assert gate.is_open  # 6 rows seen < warmup 8
    gate.record(num_rows=2, num_accepted=0)
    assert not gate.is_open
    # Closed: three skipped steps, then a probe, and so on.
    assert _steps(gate, 8) == [False, False, False, True] * 2
    assert gate.num_skipped == 6


def test_probe_results_reopen_the_gate() -> None:
    gate = DraftGate(min_accepted=0.5, probe_every=2, decay=0.5, warmup_rows=0)
    gate.record(num_rows=1, num_accepted=0)
    assert not gate.is_open
    assert _steps(gate, 2) == [False, True]
    gate.record(num_rows=1, num_accepted=3)  # mean 0.5 * 0 + 0.5 * 3 = 1.5
    assert gate.mean_accepted == pytest.approx(1.5)
    assert gate.is_open and _steps(gate, 3) == [True, True, True]


def test_accepting_drafter_is_never_paused() -> None:
    gate = DraftGate(warmup_rows=0)
    for _ in range(50):
        assert gate.should_draft()
        gate.record(num_rows=4, num_accepted=6)
    assert gate.num_skipped == 0


def test_zero_threshold_never_pauses_and_empty_records_are_ignored() -> None:
    gate = DraftGate(min_accepted=0.0, warmup_rows=0)
    gate.record(num_rows=3, num_accepted=0)
    gate.record(num_rows=0, num_accepted=0)
    assert gate.rows_seen == 3 and all(_steps(gate, 20))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"min_accepted": -0.1}, "min_accepted"),
        ({"min_accepted": float("nan")}, "min_accepted"),
        ({"probe_every": 0}, "probe_every"),
        ({"probe_every": True}, "probe_every"),
        ({"decay": 1.0}, "decay"),
        ({"warmup_rows": -1}, "warmup_rows"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        DraftGate(**kwargs)  # type: ignore[arg-type]


def test_bad_record() -> None:
    with pytest.raises(ValueError, match="num_rows"):
        DraftGate().record(num_rows=-1, num_accepted=0)


def test_break_even_sets_the_threshold_from_costs() -> None:
    # A drafter forward of 12 ms plus 3 ms more verification, on a 25 ms step: drafting pays
    # from 0.6 accepted drafts per row.
    gate = DraftGate.break_even(0.012, 0.025, verify_extra_s=0.003)
    assert gate.break_even_accepted == pytest.approx(0.6)
    assert gate.min_accepted == pytest.approx(0.6)
    # Probes cost ~0.6 of a step each: spaced 20 steps apart to spend 3% of the time.
    assert gate.probe_every == 20
    gate.record(num_rows=32, num_accepted=16)  # 0.5 per row: pays less than it costs
    assert not gate.is_open
    # A cheap drafter (a GPU): the floor keeps the plain gate's behaviour.
    cheap = DraftGate.break_even(0.0005, 0.02, probe_every=3, warmup_rows=0)
    assert cheap.break_even_accepted == pytest.approx(0.025)
    assert cheap.min_accepted == 0.25 and cheap.probe_every == 3
    assert DraftGate().break_even_accepted is None


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"draft_s": -1.0, "plain_step_s": 1.0}, "draft_s"),
        ({"draft_s": float("nan"), "plain_step_s": 1.0}, "draft_s"),
        ({"draft_s": 0.1, "plain_step_s": 0.0}, "plain_step_s"),
        ({"draft_s": 0.1, "plain_step_s": float("inf")}, "plain_step_s"),
        ({"draft_s": 0.1, "plain_step_s": 1.0, "verify_extra_s": -0.1}, "verify_extra_s"),
        ({"draft_s": 0.1, "plain_step_s": 1.0, "floor": -1.0}, "floor"),
        ({"draft_s": 0.1, "plain_step_s": 1.0, "probe_budget": 0.0}, "probe_budget"),
    ],
)
def test_break_even_rejects_bad_costs(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        DraftGate.break_even(**kwargs)


def test_timed_steps_compare_throughput_instead_of_the_price() -> None:
    """Accepted drafts above the price, but drafting steps measured slower per token than plain
    steps: the gate closes; once drafting gets faster per token, it reopens."""
    gate = DraftGate(min_accepted=0.25, probe_every=3, decay=0.5, warmup_rows=0)
    gate.record(num_rows=1, num_accepted=1, seconds=0.050)  # 2 tokens in 50 ms: 25 ms/token
    assert gate.is_open  # no plain step timed yet: the price decides (1 >= 0.25)
    gate.record_plain(num_rows=1, seconds=0.020)  # 20 ms/token without drafting
    assert gate.draft_s_per_token == pytest.approx(0.025)
    assert not gate.is_open
    assert _steps(gate, 3) == [False, False, True]  # closed: probes as before
    gate.record(num_rows=2, num_accepted=6, seconds=0.040)  # 5 ms/token: mean 15 ms
    assert gate.draft_s_per_token == pytest.approx(0.015)
    assert gate.is_open


def test_an_open_timed_gate_keeps_timing_plain_steps() -> None:
    gate = DraftGate(min_accepted=0.0, probe_every=4, warmup_rows=0)
    gate.record(num_rows=1, num_accepted=0)
    assert _steps(gate, 8) == [True] * 8  # untimed: an open gate always drafts
    gate.record(num_rows=1, num_accepted=3, seconds=0.02)
    assert _steps(gate, 8) == [True, True, True, False] * 2
    assert gate.num_skipped == 2


def test_timed_records_validate_seconds() -> None:
    gate = DraftGate()
    for bad in (0.0, -1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="seconds"):
            gate.record(1, 0, seconds=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="seconds"):
            gate.record_plain(1, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_rows"):
        gate.record_plain(-1, 0.1)
    gate.record_plain(0, 0.1)  # no rows: nothing to learn
    assert gate.plain_s_per_token is None
