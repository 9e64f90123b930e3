"""The seam through which the drafter runs its products: ``y = layer(x)`` for an ``nn.Linear``.

A drafter forward is a handful of products with few rows (the ``gamma`` block rows, one row per
sequential step), and on a CPU such products cost what reading their weights costs. An engine
that has a faster product for that shape (weights kept in a narrower exact format, a packed
layout) hands it to :meth:`DSparkDrafter.use_linear
<deepinfer_spec.drafter.DSparkDrafter.use_linear>` instead of patching the modules. The drafter
keeps its ``nn.Linear`` parameters, so training, saving and loading do not change.

A :class:`LinearFn` must return ``layer(x)`` up to floating-point rounding, keep autograd
working when it is enabled (falling back to ``layer(x)`` is enough), and accept ``x`` of any
leading shape ``[..., in_features]``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class LinearFn(Protocol):
    """``(x [..., in], layer) -> layer(x) [..., out]``, computed however the caller likes."""

    def __call__(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor: ...


def module_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """The default :class:`LinearFn`: the module itself."""
    out: torch.Tensor = layer(x)
    return out
