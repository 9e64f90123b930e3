"""The small modules a Llama decoder is built from: projections, embedding, RMSNorm.

Storage starts uninitialised (``torch.empty``): weights are either loaded or set by
``LlamaModel.init_weights``, so building a model costs no random init.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_kernels.cpu import PackedWeight, linear, rms_norm


class Linear(nn.Module):
    """``y = x W^T (+ b)``. Storage starts uninitialised (``torch.empty``): weights are either
    loaded or set by :meth:`LlamaModel.init_weights`, so building a model costs no random init.

    Without autograd on CPU in fp32 the product runs on a copy of the weight prepared on first
    use: its bf16 bits for a few rows when it is bf16-exact, else MKL-packed (see
    :mod:`deepinfer_kernels.cpu.linear`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed = PackedWeight()

    def forward(self, x: torch.Tensor, contiguous: bool = True) -> torch.Tensor:
        return linear(x, self.weight, self.bias, contiguous=contiguous, pack=self.packed)

    def _apply(self, fn: Any, recurse: bool = True) -> Linear:
        # ``.to()``, ``.cuda()``, ``.half()``... replace the weight: drop the old packed copy
        # (and the old weight it holds) now rather than at the next CPU product.
        self.packed.clear()
        return cast(Linear, super()._apply(fn, recurse))  # type: ignore[no-untyped-call]


class Embedding(nn.Module):
    """Token embedding table ``[vocab, hidden]`` (uninitialised storage, like :class:`Linear`)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2) + eps) * weight``, the mean taken in fp32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
