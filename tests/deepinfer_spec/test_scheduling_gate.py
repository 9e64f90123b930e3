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
        ({"min_timed": 0}, "min_timed"),
        ({"min_timed": 2.0}, "min_timed"),
        ({"time_window": 2, "min_timed": 3}, "time_window"),
        ({"max_break_even": 0.0}, "max_break_even"),
        ({"max_break_even": float("inf")}, "max_break_even"),
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


def _time(gate: DraftGate, rows: int, draft_s: float, plain_s: float, n: int = 3) -> None:
    """Injected step times: ``n`` drafting steps (nothing accepted) and ``n`` plain steps."""
    for _ in range(n):
        gate.record(num_rows=rows, num_accepted=0, seconds=draft_s)
        gate.record_plain(num_rows=rows, seconds=plain_s)


def test_the_price_decides_until_enough_steps_are_timed() -> None:
    gate = DraftGate(min_accepted=0.5, probe_every=4, warmup_rows=0, min_timed=3)
    gate.record(num_rows=1, num_accepted=1, seconds=0.030)
    gate.record_plain(num_rows=1, seconds=0.015)
    gate.record_plain(num_rows=1, seconds=0.015)
    assert gate.measured_break_even(1) is None  # 1 drafting, 2 plain steps timed: too few
    assert gate.threshold(1) == 0.5
    gate.record(num_rows=1, num_accepted=1, seconds=0.030)
    gate.record(num_rows=1, num_accepted=1, seconds=0.030)
    assert gate.measured_break_even(1) is None  # still 2 plain steps
    gate.record_plain(num_rows=1, seconds=0.015)
    # 30 ms drafting against 15 ms plain: a drafting step pays from 1 accepted draft per row.
    assert gate.measured_break_even(1) == pytest.approx(1.0)
    assert gate.threshold(1) == pytest.approx(1.0)
    assert gate.threshold(4) == 0.5  # another batch size is not measured: the price again


def test_measured_steps_close_a_gate_the_price_left_open() -> None:
    """The price (0.5) is below the accepted drafts (0.8), but drafting steps measure 2.25x a
    plain step: drafting needs 1.25 accepted drafts per row to pay, so the gate closes."""
    gate = DraftGate(min_accepted=0.5, probe_every=4, decay=0.0, warmup_rows=0)
    gate.record(num_rows=2, num_accepted=0)
    gate.record(num_rows=5, num_accepted=4)  # mean 0.8 accepted per row (decay 0)
    assert gate.is_open
    _time(gate, 5, draft_s=0.045, plain_s=0.020)
    gate.record(num_rows=5, num_accepted=4)
    assert gate.measured_break_even() == pytest.approx(1.25)
    assert not gate.is_open
    assert _steps(gate, 8) == [False, False, False, True] * 2  # closed: probes only


def test_measured_steps_keep_a_paying_drafter_drafting() -> None:
    """The price (1.5) is above the accepted drafts (1.0), but drafting steps measure only
    1.5x a plain step: drafting pays from 0.5, so the gate stays open."""
    gate = DraftGate(min_accepted=1.5, probe_every=4, decay=0.0, warmup_rows=0)
    _time(gate, 2, draft_s=0.030, plain_s=0.020)
    gate.record(num_rows=2, num_accepted=2)
    assert gate.measured_break_even(2) == pytest.approx(0.5)
    assert gate.is_open
    # Open and timed: one step in probe_every is plain, to keep the plain time measured.
    assert _steps(gate, 8) == [True, True, True, False] * 2


def test_probes_reopen_a_gate_closed_by_measured_times() -> None:
    gate = DraftGate(min_accepted=0.25, probe_every=3, decay=0.5, warmup_rows=0)
    _time(gate, 1, draft_s=0.030, plain_s=0.015)  # break-even 1.0; nothing accepted
    assert not gate.is_open
    assert _steps(gate, 3) == [False, False, True]
    gate.record(num_rows=1, num_accepted=3, seconds=0.030)  # the probe: mean 0.5 * 0 + 1.5
    assert gate.mean_accepted == pytest.approx(1.5)
    assert gate.is_open and _steps(gate, 2) == [True, True]


def test_step_times_follow_the_latest_window_and_resist_outliers() -> None:
    gate = DraftGate(warmup_rows=0, min_timed=3, time_window=4)
    _time(gate, 1, draft_s=0.030, plain_s=0.015)
    gate.record(num_rows=1, num_accepted=0, seconds=3.0)  # a preempted step: 100x
    assert gate.measured_break_even() == pytest.approx(1.0)  # the median moves one rank
    _time(gate, 1, draft_s=0.020, plain_s=0.020, n=4)  # the machine changed
    assert gate.measured_break_even() == pytest.approx(0.0)  # the window forgot the old ones


def test_a_load_change_does_not_leave_stale_plain_times() -> None:
    """Heavy load, then a quiet machine: an open gate times few plain steps, but each is paired
    with the drafting step next to it, so the quiet ratio wins (not quiet drafting over loaded
    plain steps, which read as free drafting)."""
    gate = DraftGate(warmup_rows=0, time_window=4)
    _time(gate, 1, draft_s=2.0, plain_s=1.0, n=3)  # loaded: both kinds 60x slower
    for _ in range(3):  # quiet: 8 drafting steps to each plain one
        for _ in range(8):
            gate.record(num_rows=1, num_accepted=0, seconds=0.030)
        gate.record_plain(num_rows=1, seconds=0.015)
    assert gate.measured_break_even(1) == pytest.approx(1.0)


def test_measured_break_even_is_bounded() -> None:
    gate = DraftGate(warmup_rows=0, max_break_even=4.0)
    _time(gate, 1, draft_s=1.0, plain_s=0.01)  # 100x: capped, so good probes still reopen
    assert gate.measured_break_even() == 4.0
    _time(gate, 2, draft_s=0.01, plain_s=0.02)  # a drafting step timed faster: never below 0
    assert gate.measured_break_even(2) == 0.0


def test_batch_sizes_are_priced_apart() -> None:
    gate = DraftGate(min_accepted=0.25, probe_every=8, decay=0.0, warmup_rows=0)
    _time(gate, 1, draft_s=0.040, plain_s=0.020)  # one row: pays from 1.0
    _time(gate, 8, draft_s=0.060, plain_s=0.050)  # eight rows: pays from 0.2
    gate.record(num_rows=8, num_accepted=4)  # 0.5 accepted per row
    assert gate.should_draft(num_rows=8) and gate.is_open
    assert not gate.should_draft(num_rows=1) and not gate.is_open


def test_an_open_timed_gate_times_plain_steps_sooner_while_few_are_timed() -> None:
    gate = DraftGate(min_accepted=0.0, probe_every=4, warmup_rows=0, min_timed=2)
    gate.record(num_rows=1, num_accepted=0)
    assert _steps(gate, 8) == [True] * 8  # untimed: an open gate always drafts
    gate.record(num_rows=1, num_accepted=3, seconds=0.02)
    # No plain step timed at this batch size yet: every other step is plain.
    assert _steps(gate, 2) == [True, False]
    gate.record_plain(num_rows=1, seconds=0.01)
    assert _steps(gate, 2) == [True, False]
    gate.record_plain(num_rows=1, seconds=0.01)
    assert _steps(gate, 8) == [True, True, True, False] * 2
    assert gate.num_skipped == 4


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
    assert gate.measured_break_even(1) is None
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_rows"):
            gate.should_draft(num_rows=bad)  # type: ignore[arg-type]
