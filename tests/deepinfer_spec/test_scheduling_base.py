"""The scheduling seam's checks: ``check_confidence_matrix`` on both of its paths (small
matrices as Python floats, large ones through ``aminmax``) and ``draft_bound``'s test for a
bounded scheduler."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from deepinfer_spec.scheduling import BoundedScheduler, FixedGammaScheduler, draft_bound
from deepinfer_spec.scheduling.base import _SMALL, check_confidence_matrix

# A small matrix and one past the small-matrix limit: each path is checked.
SHAPES = [(1, 4), (3, 8), (_SMALL // 8 + 1, 8)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_valid_confidences_pass(shape: tuple[int, int], dtype: torch.dtype) -> None:
    conf = torch.rand(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    conf[0, 0], conf[-1, -1] = 0.0, 1.0  # the bounds are probabilities
    check_confidence_matrix(conf)
    check_confidence_matrix(conf.t())  # a non-contiguous view
    check_confidence_matrix(torch.zeros(0, shape[1], dtype=dtype))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bad", [-1e-6, 1.0 + 1e-6, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", [(0, 0), (-1, -1), (0, 2)])
def test_out_of_range_confidence_raises(
    shape: tuple[int, int], bad: float, where: tuple[int, int]
) -> None:
    conf = torch.full(shape, 0.5, dtype=torch.float64)
    conf[where] = bad
    with pytest.raises(ValueError, match="confidence"):
        check_confidence_matrix(conf)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([[0.5]], TypeError),
        (torch.ones(2, 2, dtype=torch.int64), TypeError),
        (torch.ones(4), ValueError),
        (torch.ones(1, 2, 2), ValueError),
    ],
)
def test_confidence_type_and_shape_errors(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="confidence"):
        check_confidence_matrix(value)  # type: ignore[arg-type]


class _Unbounded:
    def schedule(self, confidence: Tensor) -> Tensor:
        return torch.zeros(confidence.shape[0], dtype=torch.int64)


class _Disabled(_Unbounded):
    # A member set to None: runtime Protocol checks treat it as absent.
    max_drafts = None


class _Bounded(_Unbounded):
    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.calls: list[tuple[int, int]] = []

    def max_drafts(self, num_requests: int, gamma: int) -> int:
        self.calls.append((num_requests, gamma))
        return self.bound


@pytest.mark.parametrize(
    "scheduler", [_Unbounded(), _Disabled(), _Bounded(3), FixedGammaScheduler(2)]
)
def test_draft_bound_agrees_with_the_protocol(scheduler: object) -> None:
    bounded = isinstance(scheduler, BoundedScheduler)
    got = draft_bound(scheduler, 2, 5)  # type: ignore[arg-type]
    if bounded:
        assert got == max(0, min(5, scheduler.max_drafts(2, 5)))  # type: ignore[attr-defined]
    else:
        assert got == 5


@pytest.mark.parametrize(("bound", "expected"), [(-2, 0), (0, 0), (3, 3), (9, 5)])
def test_draft_bound_clamps_and_passes_arguments(bound: int, expected: int) -> None:
    scheduler = _Bounded(bound)
    assert draft_bound(scheduler, 4, 5) == expected
    assert scheduler.calls == [(4, 5)]
