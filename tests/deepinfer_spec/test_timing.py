"""`time_draft` and `priced_gate`: what a proposal costs here, and the gate priced on it."""

from __future__ import annotations

import pytest
from conftest import make_drafter

from deepinfer_spec import FixedGammaScheduler, SPSCurve, priced_gate, time_draft


class _Counted:
    """The module's own product, counting calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x, layer):
        self.calls += 1
        return layer(x)


def test_time_draft_runs_the_proposal(target) -> None:
    drafter = make_drafter(target)
    counted = _Counted()
    drafter.use_linear(counted)
    seconds = time_draft(drafter, repeats=2, num_tokens=1)
    assert seconds > 0 and counted.calls > 0  # 1 warm-up + 2 timed proposals ran
    with pytest.raises(ValueError, match="repeats"):
        time_draft(drafter, repeats=0)


def test_priced_gate_opens_only_where_drafting_pays(target) -> None:
    drafter = make_drafter(target)
    draft_s = time_draft(drafter, repeats=3, num_tokens=1)
    # A target step 1000x slower than a proposal: drafting pays from the gate's floor on.
    slow = SPSCurve([1, 2], [1.0 / (1000 * draft_s), 1.0 / (1000 * draft_s)])
    cheap = priced_gate(drafter, FixedGammaScheduler(1), slow)
    assert cheap.break_even_accepted is not None and cheap.break_even_accepted < 0.25
    assert cheap.min_accepted == 0.25
    # A target step 100x faster than a proposal whose second token costs a whole step more:
    # drafting needs ~100 accepted drafts per row, far more than one draft can give (the bound
    # leaves room for a proposal timed 50x faster than the first measurement on a busy CPU).
    fast = SPSCurve([1, 2], [100.0 / draft_s, 50.0 / draft_s])
    dear = priced_gate(drafter, FixedGammaScheduler(1), fast)
    assert dear.break_even_accepted is not None and dear.break_even_accepted > 2
    assert dear.min_accepted == dear.break_even_accepted
