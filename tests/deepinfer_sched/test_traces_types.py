"""Trace / TraceRequest invariants, stats and the reusable-prefix search."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_sched.traces import Trace, TraceRequest, reusable_prefix_blocks


def _req(rid: int, t: float, inp: int, hashes: tuple[int, ...], **kw: object) -> TraceRequest:
    return TraceRequest(rid, t, inp, 10, hashes, **kw)  # type: ignore[arg-type]


def test_request_validation() -> None:
    with pytest.raises(ValueError, match="arrival_s"):
        _req(0, -1.0, 10, ())
    with pytest.raises(ValueError, match="input_len"):
        _req(0, 0.0, -1, ())
    with pytest.raises(ValueError, match="output_len"):
        TraceRequest(0, 0.0, 10, 0, ())
    with pytest.raises(TypeError, match="block_hashes"):
        TraceRequest(0, 0.0, 10, 1, [1, 2])  # type: ignore[arg-type]


def test_trace_validation() -> None:
    with pytest.raises(ValueError, match="sorted"):
        Trace((_req(0, 2.0, 8, ()), _req(1, 1.0, 8, ())), 4)
    with pytest.raises(ValueError, match="full blocks"):
        Trace((_req(0, 0.0, 7, (1, 2)),), 4)
    with pytest.raises(ValueError, match="unique"):
        Trace((_req(0, 0.0, 8, ()), _req(0, 1.0, 8, ())), 4)
    with pytest.raises(ValueError, match="block_size"):
        Trace((), 0)


def test_stats_by_hand() -> None:
    # block_size 4: r0 has blocks (1, 2); r1 shares block 1 then diverges; r2 repeats r0.
    t = Trace(
        (
            _req(0, 0.0, 9, (1, 2), tenant="a", conversation_id=0),
            _req(1, 1.0, 12, (1, 3, 4), tenant="b", conversation_id=1, kind="agent"),
            _req(2, 3.0, 8, (1, 2), tenant="a", conversation_id=0),
        ),
        4,
    )
    s = t.stats()
    assert s.num_requests == 3
    assert s.total_input_tokens == 29
    assert s.reusable_tokens == 4 + 8  # r1 reuses block 1, r2 reuses both blocks
    assert s.reusable_fraction == pytest.approx(12 / 29)
    assert s.duration_s == 3.0
    assert s.request_rate == pytest.approx(2 / 3)
    assert s.num_conversations == 2 and s.num_tenants == 2
    assert s.kinds == {"agent": 1, "chat": 2}
    assert len(t[1:]) == 2 and t[0].request_id == 0


def test_scaled_divides_arrivals() -> None:
    t = Trace((_req(0, 1.0, 4, ()), _req(1, 3.0, 4, ())), 4, "x")
    s = t.scaled(2.0)
    assert [r.arrival_s for r in s] == [0.5, 1.5]
    assert s.block_size == 4 and s[1].input_len == 4
    with pytest.raises(ValueError, match="load_factor"):
        t.scaled(0.0)


@given(st.lists(st.integers(0, 50), max_size=40, unique=True), st.integers(0, 40))
def test_reusable_prefix_blocks_matches_linear_scan(ids: list[int], cut: int) -> None:
    hashes = tuple(ids)
    seen = set(hashes[:cut])  # a prefix-closed seen set, as chaining guarantees
    expected = 0
    while expected < len(hashes) and hashes[expected] in seen:
        expected += 1
    assert reusable_prefix_blocks(hashes, seen) == expected == min(cut, len(hashes))
