"""Running another module's ``nn.Linear`` layers on the model's CPU products.

:class:`ModuleLinear` is a ``deepinfer_spec`` ``LinearFn`` (``(x, layer) -> layer(x)``): the
engine hands it to the DSpark drafter (``DSparkDrafter.use_linear``) so that the drafter's
few-row products take the same paths as the model's own (:func:`deepinfer_kernels.cpu.linear.linear`):
bf16 panels for bf16-exact weights (a drafter checkpoint saved in bf16 and run in fp32 is
exact), MKL's packed GEMM for more rows, ``F.linear`` otherwise or while autograd is on.

Why: a drafter proposal is a dozen products of 1 to 5 rows. Through ``nn.Linear`` they ran on
MKL's row-major kernel, which is 2-3x slower than the alternatives for those shapes on an x86
CPU, and read fp32 weights where bf16 ones hold the same values.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from deepinfer_kernels.cpu.bf16_weight_linear import Bf16WeightLinear
from deepinfer_kernels.cpu.linear import PackedWeight, linear


class ModuleLinear:
    """``layer(x)`` through :func:`~deepinfer_kernels.cpu.linear.linear` with a
    :class:`~deepinfer_kernels.cpu.linear.PackedWeight` per layer (kept while the layer lives).

    ``kernel``: the bf16-panel product (``LlamaModel.cpu_kernels.linear``), or None for the MKL
    paths only.
    """

    def __init__(self, kernel: Bf16WeightLinear | None) -> None:
        self.kernel = kernel
        self._packs: weakref.WeakKeyDictionary[nn.Linear, PackedWeight] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        pack = self._packs.get(layer)
        if pack is None:
            pack = self._packs[layer] = PackedWeight(self.kernel)
        return linear(x, layer.weight, layer.bias, pack=pack)
