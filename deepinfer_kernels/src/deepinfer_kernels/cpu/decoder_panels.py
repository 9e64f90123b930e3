"""Every decoder layer's projection weights as bf16 panels, for :class:`DecoderLayerKernel`.

A model asks :meth:`DecoderPanels.get` at every step that could take the compiled layer; it
answers the same tuple of :class:`~deepinfer_kernels.cpu.decoder_layer.LayerPanels` while the
weights it was built from are unchanged (so that ``DecoderLayerKernel.bind`` checks them once,
not every step), and rebuilds it when any projection's weight or bias was replaced or modified
in place. The panels themselves are the projections' own :class:`PackedWeight` copies (the
same bytes the bf16 linear path reads), so the fused path costs no second copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter, is_
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


def _holder(proj: Projection) -> dict[str, Any]:
    # An nn.Module's parameters live in its _parameters dict: reading that dict is a few
    # dictionary lookups, where ``module.weight`` goes through nn.Module.__getattr__.
    return proj._parameters if isinstance(proj, nn.Module) else vars(proj)


_VERSION = attrgetter("_version")


class WeightSnapshot:
    """Which tensors a set of parameter slots held when it was taken, so that a later
    :meth:`is_current` tells whether any slot now holds another tensor (a replaced parameter
    or bias), any weight another storage (``.data`` reassigned) or any weight was modified in
    place (its version counter moved; inference tensors keep none and are not followed).

    The checks run as C-level ``map`` loops over the slots, no Python bytecode per slot: a
    model asks at every step (120 projections in SmolLM2-135M), and a per-slot Python loop
    cost ~0.2 ms of a ~12 ms decode step on a loaded CPU."""

    def __init__(self, holders: Sequence[dict[str, Any]], names: Sequence[str]) -> None:
        self._holders = [h for h in holders for _ in names]
        self._names = [n for _ in holders for n in names]
        self._tensors = list(map(dict.get, self._holders, self._names))
        present = [t for t in self._tensors if isinstance(t, torch.Tensor)]
        self._present = present
        self._ptrs = [t.data_ptr() for t in present]
        self._versioned = [t for t in present if not t.is_inference()]
        self._versions = list(map(_VERSION, self._versioned))

    def is_current(self) -> bool:
        """Whether every slot holds the same tensor (or None), over the same storage, at the
        same version as when the snapshot was taken."""
        return (
            all(map(is_, map(dict.get, self._holders, self._names), self._tensors))
            and list(map(torch.Tensor.data_ptr, self._present)) == self._ptrs
            and list(map(_VERSION, self._versioned)) == self._versions
        )


class LayerWeightCache(Generic[W]):
    """Every decoder layer's weights in a compiled layer's layout ``W``, built on first use and
    kept (or their refusal: None) while the projections' weights are current.

    ``projections`` is called only to (re)build: it returns every layer's
    :data:`LayerProjections` in order. Subclasses say how one layer is built (:meth:`build`).
    """

    def __init__(self, projections: Callable[[], Sequence[LayerProjections]]) -> None:
        self._projections = projections
        self._panels: tuple[W, ...] = ()
        # Every projection's weight and bias as they were when the weights were built.
        self._sources: WeightSnapshot | None = None

    def build(self, layer: LayerProjections) -> W | None:
        """One layer's weights, or None when the kernel does not take this layer."""
        raise NotImplementedError

    def get(self) -> tuple[W, ...] | None:
        """Every layer's weights, or None when some layer is refused by :meth:`build`. Both
        answers are kept while the weights are current, so a model whose weights the kernel
        does not take asks nothing of them at each step."""
        if self._sources is not None and self._sources.is_current():
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
        # What the projections hold after building (as before: building may touch them).
        projections = [p for layer in layers for p in layer]
        holders = [_holder(p) for p in projections]
        sources = WeightSnapshot(holders, ("weight", "bias"))
        # A projection whose weight or bias is not the tensor in its parameter slots (a
        # property, say) cannot be followed by the snapshot: rebuild at every step then.
        followed = all(
            h.get("weight") is p.weight and h.get("bias") is p.bias
            for h, p in zip(holders, projections, strict=True)
        )
        self._sources = sources if followed else None
        return self._panels or None

    def is_current(self) -> bool:
        """Whether every projection still has the weight (same tensor, storage and version)
        and bias the weights were made from (False before the first :meth:`get`)."""
        return self._sources is not None and self._sources.is_current()

    def clear(self) -> None:
        """Forget the weights (the projections keep their own copies)."""
        self._panels, self._sources = (), None


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
