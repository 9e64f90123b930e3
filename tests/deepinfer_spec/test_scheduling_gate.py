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
