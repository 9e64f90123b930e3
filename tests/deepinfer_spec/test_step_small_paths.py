"""The drafting step's plain-int paths equal the tensor paths they stand in for: STS
calibration of a small block, greedy verification on ints, one-slot ring appends and views."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_spec import ContextRing
from deepinfer_spec.calibration import apply_temperatures
from deepinfer_spec.step import SMALL_CALIBRATION, calibrated, greedy_accepts, target_argmax


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 4),
    width=st.integers(1, 5),
    edges=st.booleans(),
)
def test_small_calibration_equals_apply_temperatures(
    seed: int, rows: int, width: int, edges: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    conf = torch.rand(rows, width, generator=gen)
    if edges:  # the clamp's side of 0 and 1
        conf[0, 0] = 0.0
        conf[-1, -1] = 1.0
    temps = torch.rand(width, generator=gen) * 10 + 0.01
    assert conf.numel() <= SMALL_CALIBRATION
    assert torch.equal(calibrated(conf, temps), apply_temperatures(conf, temps))


def test_small_calibration_refuses_what_apply_temperatures_refuses() -> None:
    temps = torch.ones(2)
    with pytest.raises(ValueError, match="NaN"):
        calibrated(torch.tensor([[0.5, float("nan")]]), temps)
    with pytest.raises(ValueError, match="probabilities"):
        calibrated(torch.tensor([[0.5, 1.5]]), temps)
    with pytest.raises(ValueError, match="finite and > 0"):
        calibrated(torch.tensor([[0.5, 0.5]]), torch.tensor([1.0, 0.0]))
    # Not a [B, m] fp32 block of matching width: the op itself answers.
    with pytest.raises(ValueError, match="shape"):
        calibrated(torch.tensor([[0.5, 0.5]]), torch.ones(3))


@settings(max_examples=60, deadline=None)
@given(
    drafts=st.lists(st.lists(st.integers(0, 3), max_size=5), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_greedy_accepts_is_the_greedy_rule(drafts: list[list[int]], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    best = [torch.randint(0, 4, (len(d) + 1,), generator=gen).tolist() for d in drafts]
    for (acc, tokens), row, row_best in zip(greedy_accepts(drafts, best), drafts, best):
        assert row[:acc] == row_best[:acc]  # every accepted draft is the target's argmax
        assert acc == len(row) or row[acc] != row_best[acc]  # stopped at the first miss
        assert tokens == [*row[:acc], row_best[acc]]


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(st.integers(0, 9), min_size=1, max_size=8),
    window=st.integers(1, 6),
)
def test_one_slot_append_and_view_equal_the_tensor_methods(chunks: list[int], window: int) -> None:
    by_slot = ContextRing(2, window=window, feature_dim=3)
    by_tensor = ContextRing(2, window=window, feature_dim=3)
    total = 0
    for n in chunks:
        rows = (torch.arange(total, total + n, dtype=torch.float32) + 1)[:, None].repeat(1, 3)
        by_slot.append_slot(1, rows)
        by_tensor.append(torch.tensor([1]), rows[None], torch.tensor([n]))
        total += n
        got, want = by_slot.view_slots([1, 0]), by_tensor.view(torch.tensor([1, 0]))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        got, want = by_slot.view_slots([1]), by_tensor.view(torch.tensor([1]))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert by_slot.counts(torch.tensor([1])).tolist() == [total]


def test_one_slot_calls_name_bad_arguments() -> None:
    ring = ContextRing(2, window=4, feature_dim=3)
    with pytest.raises(ValueError, match="slot"):
        ring.append_slot(2, torch.zeros(1, 3))
    with pytest.raises(ValueError, match="features"):
        ring.append_slot(0, torch.zeros(1, 4))
    with pytest.raises(ValueError, match="duplicate"):
        ring.view_slots([0, 0])
    with pytest.raises(ValueError, match="slot"):
        ring.view_slots([-1])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), nan=st.booleans(), ties=st.booleans())
def test_target_argmax_is_torch_argmax(seed: int, nan: bool, ties: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 7, generator=gen)
    if ties:  # equal maxima: the first wins
        logits = logits.round()
    if nan:  # NaN wins, the first of them
        logits[1, 0, 5] = logits[1, 0, 2] = float("nan")
    with torch.inference_mode():
        frozen = logits.clone()
    want = torch.argmax(logits, dim=-1).tolist()
    assert target_argmax(logits) == want
    assert target_argmax(frozen) == want  # the forward's logits are inference tensors
    assert target_argmax(logits.double()) == want  # other dtypes: torch's own reduction


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=12),
    window=st.integers(1, 6),
    slack=st.integers(0, 3),
)
def test_one_slot_view_is_a_slice_of_the_ring_through_rollbacks(
    steps: list[tuple[int, int]], window: int, slack: int
) -> None:
    """Appends and rollbacks (at most ``slack``, past a reset too): the one-slot view, a slice
    of the ring's storage, equals the copying view, zero padding and validity included."""
    ring = ContextRing(1, window=window, feature_dim=2, slack=slack)
    storage = ring.view_slots([0])[0].untyped_storage().data_ptr()  # a fresh slot: a slice
    total = high = 0
    for n, back in steps:
        rows = (torch.arange(total, total + n, dtype=torch.float32) + 1)[:, None].repeat(1, 2)
        ring.append_slot(0, rows)
        total += n
        high = max(high, total)
        back = min(back, slack, total)
        ring.rollback(torch.tensor([0]), torch.tensor([back]))
        total -= back
        got, want = ring.view_slots([0]), ring.view(torch.tensor([0]))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        # A slice of the ring unless rollbacks left rolled-back rows under a short window.
        sliced = got[0].untyped_storage().data_ptr() == storage
        assert sliced == (total >= window or high - total <= slack)
        if n == 5:  # a reset in between: the slot starts over from zeros
            ring.reset(torch.tensor([0]))
            total = high = 0
