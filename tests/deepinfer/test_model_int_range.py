"""`deepinfer.models.int_range`: min and max of an integer tensor, on both of its paths."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.models.int_range import SHORT, int_range


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=2 * SHORT + 3),
    dtype=st.sampled_from([torch.int32, torch.int64]),
    rows=st.sampled_from([1, 2]),
)
def test_int_range_is_the_tensor_min_and_max(
    values: list[int], dtype: torch.dtype, rows: int
) -> None:
    if dtype == torch.int32:
        values = [max(-(2**31), min(2**31 - 1, v)) for v in values]
    t = torch.tensor(values * rows, dtype=dtype).reshape(rows, -1)
    got = int_range(t)
    assert got == (int(t.min()), int(t.max()))
    assert all(type(v) is int for v in got)


def test_int_range_of_an_empty_tensor_is_none() -> None:
    assert int_range(torch.zeros(0, dtype=torch.int64)) is None
    assert int_range(torch.zeros((2, 0), dtype=torch.int32)) is None
