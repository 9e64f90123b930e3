"""ContextRing: windowed views, ragged appends, rollback across the window boundary."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_spec import ContextRing


def _feats(start: int, n: int, dim: int = 3) -> torch.Tensor:
    """Feature of absolute position p is the vector filled with p + 1 (0 means padding)."""
    return (torch.arange(start, start + n, dtype=torch.float32) + 1)[:, None].repeat(1, dim)


def test_view_orders_oldest_first_and_pads_left() -> None:
    ring = ContextRing(2, window=4, feature_dim=3)
    ring.append(torch.tensor([1]), _feats(0, 2)[None], torch.tensor([2]))
    feats, valid = ring.view(torch.tensor([1, 0]))
    assert valid.tolist() == [[False, False, True, True], [False] * 4]
    assert feats[0, :, 0].tolist() == [0, 0, 1, 2]
    assert feats[1].abs().sum() == 0


@given(
    chunks=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    window=st.integers(1, 6),
)
def test_view_is_the_last_window_positions(chunks: list[int], window: int) -> None:
    ring = ContextRing(1, window=window, feature_dim=3)
    total = 0
    for n in chunks:
        ring.append(torch.tensor([0]), _feats(total, n)[None], torch.tensor([n]))
        total += n
    feats, valid = ring.view(torch.tensor([0]))
    expect = [float(p + 1) if p >= 0 else 0.0 for p in range(total - window, total)]
    assert feats[0, :, 0].tolist() == expect
    assert valid[0].tolist() == [p >= 0 for p in range(total - window, total)]
    assert int(ring.counts(torch.tensor([0]))[0]) == total


def test_ragged_append_only_writes_each_rows_prefix() -> None:
    ring = ContextRing(3, window=5, feature_dim=3)
    feats = torch.stack([_feats(0, 4), _feats(0, 4) * 10, _feats(0, 4) * 100])
    ring.append(torch.tensor([2, 0, 1]), feats, torch.tensor([4, 1, 0]))
    assert ring.counts(torch.tensor([0, 1, 2])).tolist() == [1, 0, 4]
    view, _ = ring.view(torch.tensor([0]))
    assert view[0, :, 0].tolist() == [0, 0, 0, 0, 10]


@given(
    prefix=st.integers(0, 20),
    accepted=st.integers(0, 5),
    window=st.integers(1, 8),
)
def test_rollback_equals_never_having_appended(prefix: int, accepted: int, window: int) -> None:
    """Append a whole verify block eagerly, roll back the rejected tail: the state must be the
    one produced by appending only the accepted tokens, across the window boundary."""
    gamma = 5
    eager = ContextRing(1, window=window, feature_dim=3, slack=gamma + 1)
    exact = ContextRing(1, window=window, feature_dim=3)
    slot = torch.tensor([0])
    eager.append(slot, _feats(0, prefix)[None], torch.tensor([prefix]))
    exact.append(slot, _feats(0, prefix)[None], torch.tensor([prefix]))
    # The eager ring writes garbage for the rejected positions: they must never show up.
    block = _feats(prefix, gamma + 1)
    block[accepted + 1 :] = -7.0
    eager.append(slot, block[None], torch.tensor([gamma + 1]))
    eager.rollback(slot, torch.tensor([gamma - accepted]))
    exact.append(slot, block[None, : accepted + 1], torch.tensor([accepted + 1]))
    fa, va = eager.view(slot)
    fb, vb = exact.view(slot)
    assert torch.equal(fa, fb) and torch.equal(va, vb)
    assert torch.equal(eager.counts(slot), exact.counts(slot))
    # And the two stay identical after more traffic wraps the ring again.
    more = _feats(prefix + accepted + 1, 2 * window + 3)
    for ring in (eager, exact):
        ring.append(slot, more[None], torch.tensor([more.shape[0]]))
    assert torch.equal(eager.view(slot)[0], exact.view(slot)[0])


def test_rollback_deeper_than_slack_is_refused() -> None:
    ring = ContextRing(1, window=4, feature_dim=3, slack=2)
    ring.append(torch.tensor([0]), _feats(0, 6)[None], torch.tensor([6]))
    with pytest.raises(ValueError, match="lengths"):
        ring.rollback(torch.tensor([0]), torch.tensor([3]))
    with pytest.raises(ValueError, match="past the start"):
        fresh = ContextRing(1, window=4, feature_dim=3, slack=2)
        fresh.rollback(torch.tensor([0]), torch.tensor([1]))


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="window"):
        ContextRing(1, window=0, feature_dim=3)
    ring = ContextRing(2, window=4, feature_dim=3)
    with pytest.raises(ValueError, match="slots"):
        ring.view(torch.tensor([2]))
    with pytest.raises(ValueError, match="duplicate"):
        ring.view(torch.tensor([1, 1]))
    with pytest.raises(TypeError, match="slots"):
        ring.view(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="features"):
        ring.append(torch.tensor([0]), torch.zeros(1, 2, 4), torch.tensor([2]))
    with pytest.raises(ValueError, match="lengths"):
        ring.append(torch.tensor([0]), torch.zeros(1, 2, 3), torch.tensor([3]))


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.lists(st.integers(0, 12), min_size=3, max_size=3), min_size=1, max_size=6),
    window=st.integers(1, 6),
    slack=st.integers(0, 3),
    order=st.permutations([0, 1, 2]),
)
def test_ragged_batches_of_slots_match_a_list_per_slot(
    steps: list[list[int]], window: int, slack: int, order: list[int]
) -> None:
    """Several slots per call, ragged lengths (0, shorter and longer than the ring), slots in
    any order: every view is each slot's last ``window`` positions (the CPU slice path)."""
    ring = ContextRing(3, window=window, feature_dim=2, slack=slack)
    seen: list[list[float]] = [[], [], []]
    slots = torch.tensor(order)
    for lengths in steps:
        width = max(lengths)
        feats = torch.zeros(3, width, 2)
        for b, slot in enumerate(order):
            values = [100.0 * slot + len(seen[slot]) + i + 1 for i in range(lengths[b])]
            feats[b, : lengths[b]] = torch.tensor(values)[:, None]
            seen[slot] += values
        ring.append(slots, feats, torch.tensor(lengths))
        view, valid = ring.view(slots)
        for b, slot in enumerate(order):
            last = seen[slot][-window:]
            pad = window - len(last)
            assert view[b, :, 0].tolist() == [0.0] * pad + last
            assert valid[b].tolist() == [False] * pad + [True] * len(last)
