"""`run_goodput`: one finite run's goodput, counted the same way for a live run and its
simulation (SLO test, failed requests, the window)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sched.report import SLO, run_goodput

SLO_ = SLO(ttft_s=1.0, tpot_s=0.1)


def test_window_is_time_zero_to_the_last_end_and_failures_count_in_the_total() -> None:
    reqs = [
        (0.5, 0.8, 1.5, 8),  # TTFT 0.8, TPOT 0.1: meets both (bounds are inclusive)
        (1.0, 1.2, 1.6, 5),  # TTFT over
        (2.0, 0.3, 1.3, 3),  # TPOT 0.5 over; ends last, at 3.3
        (2.5, 0.2, 0.2, 1),  # one token: TPOT 0
    ]
    g = run_goodput(reqs, SLO_, total=6)
    assert (g.met, g.total, g.window_s) == (2, 6, pytest.approx(3.3))
    assert g.goodput_rps == pytest.approx(2 / 3.3)
    assert g.attainment == pytest.approx(2 / 6)
    # The window does not start at the first arrival: a run whose first request comes late
    # has that idle lead-in on both sides (the workload's time zero is shared).
    assert run_goodput([(5.0, 0.1, 0.2, 2)], SLO_).window_s == pytest.approx(5.2)
    empty = run_goodput([], SLO_, total=3)
    assert (empty.goodput_rps, empty.attainment) == (0.0, 0.0)


def test_bad_requests_are_refused_naming_the_entry() -> None:
    with pytest.raises(ValueError, match=r"requests\[1\].*ttft <= e2e"):
        run_goodput([(0.0, 0.1, 0.2, 2), (0.0, 0.5, 0.2, 2)], SLO_)
    with pytest.raises(ValueError, match=r"requests\[0\].*finite"):
        run_goodput([(math.nan, 0.1, 0.2, 2)], SLO_)
    with pytest.raises(ValueError, match=r"requests\[0\]: output_tokens"):
        run_goodput([(0.0, 0.1, 0.2, 0)], SLO_)
    with pytest.raises(ValueError, match="total"):
        run_goodput([(0.0, 0.1, 0.2, 2)] * 3, SLO_, total=2)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 50),
            st.floats(0, 5),
            st.floats(0, 5),
            st.integers(1, 64),
        ),
        max_size=30,
    )
)
def test_matches_a_direct_count(raw: list[tuple[float, float, float, int]]) -> None:
    reqs = [(s, a, a + b, n) for s, a, b, n in raw]
    g = run_goodput(reqs, SLO_)
    met = sum(1 for s, a, e, n in reqs if a <= 1.0 and (e - a) / max(1, n - 1) <= 0.1)
    assert g.met == met and g.total == len(reqs)
    assert g.window_s == (max(s + e for s, _, e, _ in reqs) if reqs else 0.0)
    assert 0.0 <= g.attainment <= 1.0
