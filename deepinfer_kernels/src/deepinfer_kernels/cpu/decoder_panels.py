"""Every decoder layer's projection weights as bf16 panels, for :class:`DecoderLayerKernel`.

A model asks :meth:`DecoderPanels.get` at every step that could take the compiled layer; it
answers the same tuple of :class:`~deepinfer_kernels.cpu.decoder_layer.LayerPanels` while the
weights it was built from are unchanged (so that ``DecoderLayerKernel.bind`` checks them once,
not every step), and rebuilds it when any projection's weight or bias was replaced or modified
in place. The panels themselves are the projections' own :class:`PackedWeight` copies (the
same bytes the bf16 linear path reads), so the fused path costs no second copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from deepinfer_kernels.cpu.decoder_layer import LayerPanels
from deepinfer_kernels.cpu.linear import PackedWeight


class Projection(Protocol):
    """A projection the panels are made from (``deepinfer.models.layers.Linear`` is one)."""

    @property
    def weight(self) -> torch.Tensor: ...
    @property
    def bias(self) -> torch.Tensor | None: ...
    @property
    def packed(self) -> PackedWeight: ...


W = TypeVar("W")

# One layer's (qkv, o, gate_up, down) projections.
LayerProjections = tuple[Projection, Projection, Projection, Projection]


def weight_key(weight: torch.Tensor) -> tuple[int, int]:
    """Storage and version of a weight (inference tensors have no version: 0)."""
    return weight.data_ptr(), 0 if weight.is_inference() else weight._version


def _holder(proj: Projection) -> Mapping[str, Any]:
    # An nn.Module's parameters live in its _parameters dict: reading that dict is a few
    # dictionary lookups, where ``module.weight`` goes through nn.Module.__getattr__.
    return proj._parameters if isinstance(proj, nn.Module) else vars(proj)


class LayerWeightCache(Generic[W]):
    """Every decoder layer's weights in a compiled layer's layout ``W``, built on first use and
    kept (or their refusal: None) while the projections' weights are current.

    ``projections`` is called only to (re)build: it returns every layer's
    :data:`LayerProjections` in order. Subclasses say how one layer is built (:meth:`build`).
    """

    def __init__(self, projections: Callable[[], Sequence[LayerProjections]]) -> None:
        self._projections = projections
        self._panels: tuple[W, ...] = ()
        # Per projection: where its parameters live, its weight, bias and weight key.
        self._sources: list[tuple[Mapping[str, Any], torch.Tensor, Any, tuple[int, int]]] = []

    def build(self, layer: LayerProjections) -> W | None:
        """One layer's weights, or None when the kernel does not take this layer."""
        raise NotImplementedError

    def get(self) -> tuple[W, ...] | None:
        """Every layer's weights, or None when some layer is refused by :meth:`build`. Both
        answers are kept while the weights are current, so a model whose weights the kernel
        does not take asks nothing of them at each step."""
        if self._sources and self.is_current():
            return self._panels or None
        self.clear()
        layers = self._projections()
        out: list[W] = []
        for layer in layers:
            built = self.build(layer)
            if built is None:
                out = []
                break
            out.append(built)
        self._panels = tuple(out)
        self._sources = [
            (_holder(p), p.weight, p.bias, weight_key(p.weight)) for layer in layers for p in layer
        ]
        return self._panels or None

    def is_current(self) -> bool:
        """Whether every projection still has the weight (same tensor, storage and version)
        and bias the weights were made from."""
        # A plain loop, no generator or helper call per projection: a model asks at every
        # step (120 projections in SmolLM2-135M).
        for params, weight, bias, (ptr, version) in self._sources:
            if (
                params.get("weight") is not weight
                or params.get("bias") is not bias
                or weight.data_ptr() != ptr
                or (version and weight._version != version)
                or (not version and not weight.is_inference() and weight._version)
            ):
                return False
        return True

    def clear(self) -> None:
        """Forget the weights (the projections keep their own copies)."""
        self._panels, self._sources = (), []


class DecoderPanels(LayerWeightCache[LayerPanels]):
    """The bf16 panels of a model's decoder layers (see the module doc)."""

    def build(self, layer: LayerProjections) -> LayerPanels | None:
        """None when a projection other than QKV has a bias or a weight is not bf16-exact."""
        qkv, *plain = layer
        if any(p.bias is not None for p in plain):
            return None
        panels = [p.packed.bf16(p.weight) for p in layer]
        if any(t is None for t in panels):
            return None
        bias = qkv.bias
        q, o, gu, d = (t for t in panels if t is not None)
        return LayerPanels(q, None if bias is None else bias.detach(), o, gu, d)
