"""Report builder against hand computation, JSON output, validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_sched.report import SLO, RequestRecord, build_report

NAN = math.nan


def _rec(
    rid: int,
    arr: float,
    first: float,
    fin: float,
    inp: int = 100,
    out: int = 11,
    cached: int = 0,
    tenant: str = "default",
) -> RequestRecord:
    return RequestRecord(rid, arr, first, fin, inp, out, cached, False, 0, 1, tenant)


def _rejected(rid: int, inp: int = 100, tenant: str = "default") -> RequestRecord:
    return RequestRecord(rid, 1.0, NAN, NAN, inp, 5, 0, True, -1, -1, tenant)


def test_by_hand() -> None:
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    recs = [
        _rec(0, 0.0, 0.5, 1.5, out=11, cached=80, tenant="a"),  # ttft .5, tpot .1 -> meets
        _rec(1, 1.0, 3.0, 4.0, out=11, cached=0, tenant="a"),  # ttft 2 -> misses
        _rec(2, 2.0, 2.2, 5.2, out=11, cached=100, tenant="b"),  # tpot .3 -> misses
        _rec(3, 3.0, 3.1, 3.1, out=1, cached=50, tenant="b"),  # one token: tpot 0 -> meets
        _rejected(4, tenant="b"),
    ]
    rep = build_report(recs, slo, {0: 5.0, 1: 2.5}, duration_s=10.0, hit_price=0.1, miss_price=5.0)
    assert (rep.num_requests, rep.num_completed, rep.num_rejected, rep.num_met_slo) == (5, 4, 1, 2)
    ttfts = [0.5, 2.0, 0.2, 0.1]
    assert rep.ttft_s.p50 == pytest.approx(float(np.percentile(ttfts, 50)))
    assert rep.ttft_s.p50 == pytest.approx(0.35)  # midpoint of .2 and .5 (sorted ranks 1, 2)
    assert rep.ttft_s.p90 == pytest.approx(0.5 + 0.7 * 1.5)  # rank 2.7 of 0..3
    assert rep.ttft_s.mean == pytest.approx(sum(ttfts) / 4)
    assert rep.tpot_s.p99 == pytest.approx(float(np.percentile([0.1, 0.1, 0.3, 0.0], 99)))
    assert rep.e2e_s.p50 == pytest.approx(float(np.percentile([1.5, 3.0, 3.2, 0.1], 50)))
    assert rep.goodput_rps == pytest.approx(0.2)
    assert rep.throughput_rps == pytest.approx(0.4)
    assert rep.slo_attainment == pytest.approx(2 / 5)
    assert rep.hit_rate == pytest.approx(230 / 400)
    assert rep.input_tokens == 400 and rep.cached_tokens == 230
    assert rep.utilisation == {0: 0.5, 1: 0.25}
    assert rep.mean_utilisation == pytest.approx(0.375)
    assert rep.cost_per_million_input_tokens == pytest.approx((230 * 0.1 + 170 * 5.0) / 400 * 1e6)
    assert rep.output_tokens_per_s == pytest.approx(34 / 10)
    assert rep.per_tenant["a"].num_met == 1 and rep.per_tenant["a"].slo_attainment == 0.5
    assert rep.per_tenant["b"].num_rejected == 1
    assert rep.per_tenant["b"].slo_attainment == pytest.approx(1 / 3)


def test_json_round_trip_and_empty() -> None:
    rep = build_report([_rejected(0)], SLO(1.0, 0.1), {}, 1.0, 0.0, 1.0)
    d = json.loads(rep.to_json())
    assert d == rep.to_dict()
    assert d["ttft_s"]["p50"] is None and d["hit_rate"] is None
    assert d["num_rejected"] == 1 and d["goodput_rps"] == 0.0
    full = build_report([_rec(0, 0.0, 0.1, 1.0)], SLO(1.0, 0.1), {3: 0.5}, 2.0, 0.0, 1.0)
    fd = json.loads(full.to_json(indent=None))
    assert fd["utilisation"] == {"3": 0.25}
    assert fd["slo"] == {"ttft_s": 1.0, "tpot_s": 0.1}


def test_validation() -> None:
    with pytest.raises(ValueError, match="ttft_s"):
        SLO(0.0, 1.0)
    with pytest.raises(ValueError, match="cached_tokens"):
        _rec(0, 0.0, 1.0, 2.0, inp=10, cached=11)
    with pytest.raises(ValueError, match="arrival_s <= first_token_s"):
        _rec(0, 1.0, 0.5, 2.0)
    with pytest.raises(ValueError, match="duration_s"):
        build_report([], SLO(1.0, 1.0), {}, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="price"):
        build_report([], SLO(1.0, 1.0), {}, 1.0, -1.0, 1.0)


@given(
    st.lists(
        st.tuples(
            st.floats(0, 100), st.floats(0, 10), st.floats(0, 10), st.integers(1, 50), st.booleans()
        ),
        min_size=1,
        max_size=40,
    ),
    st.floats(0.05, 5.0),
    st.floats(0.01, 1.0),
)
def test_properties(
    rows: list[tuple[float, float, float, int, bool]], ttft: float, tpot: float
) -> None:
    recs = []
    for i, (arr, wait, dec, out, rej) in enumerate(rows):
        if rej:
            recs.append(_rejected(i))
        else:
            recs.append(_rec(i, arr, arr + wait, arr + wait + dec, out=out, cached=i % 100))
    slo = SLO(ttft, tpot)
    rep = build_report(recs, slo, {0: 1.0}, 100.0, 0.0, 1.0)
    met = sum(r.meets(slo) for r in recs)
    assert rep.num_met_slo == met
    assert rep.goodput_rps == pytest.approx(met / 100.0)
    assert rep.num_completed + rep.num_rejected == len(recs)
    done = [r for r in recs if not r.rejected]
    if done:
        assert rep.ttft_s.p50 <= rep.ttft_s.p90 <= rep.ttft_s.p99
        assert min(r.ttft_s for r in done) <= rep.ttft_s.p50 <= max(r.ttft_s for r in done)
        assert rep.ttft_s.p99 == pytest.approx(float(np.percentile([r.ttft_s for r in done], 99)))
    assert 0.0 <= rep.slo_attainment <= 1.0
    # Reports are deterministic and JSON-safe.
    again = build_report(recs, slo, {0: 1.0}, 100.0, 0.0, 1.0)
    assert again.to_json() == rep.to_json()
