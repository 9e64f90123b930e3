"""`int_range`: the smallest and largest value of an integer tensor, for the range checks of
ids and positions at the top of a forward."""

from __future__ import annotations

import torch

# Up to this many values go through Python's min/max over a list: for a decode step's few
# tokens that costs less than two tensor reductions (each a dispatch after ~10 ms of kernels
# have evicted the interpreter's working set).
SHORT = 16


def int_range(values: torch.Tensor) -> tuple[int, int] | None:
    """``(min, max)`` of ``values`` as Python ints, or None when it is empty."""
    count = values.numel()
    if count == 0:
        return None
    if count <= SHORT:
        flat = values.reshape(-1).tolist()
        return min(flat), max(flat)
    return int(values.min()), int(values.max())
