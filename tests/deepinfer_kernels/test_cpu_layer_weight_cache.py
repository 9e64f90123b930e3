"""``LayerWeightCache``: its weights are rebuilt after any change to a projection's parameters.

The model tests (``test_model_*_layer_kernel.py``) cover in-place changes, a replaced weight and
an added QKV bias on real layers; this covers every kind of change in any slot, ``.data``
reassigned included, on a cache that builds nothing but a tuple."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from deepinfer_kernels.cpu.decoder_panels import LayerProjections, LayerWeightCache


class _Tuples(LayerWeightCache[tuple[torch.Tensor, ...]]):
    """Builds each layer's weights as the tuple of its projections' weights."""

    def build(self, layer: LayerProjections) -> tuple[torch.Tensor, ...] | None:
        return tuple(p.weight for p in layer)


def _layers(count: int) -> list[LayerProjections]:
    def layer(i: int) -> LayerProjections:
        qkv = nn.Linear(4, 6, bias=i % 2 == 0)
        o, gu, d = (nn.Linear(4, 4, bias=False) for _ in range(3))
        return (qkv, o, gu, d)  # type: ignore[return-value]

    return [layer(i) for i in range(count)]


def test_unchanged_weights_are_kept() -> None:
    layers = _layers(3)
    cache = _Tuples(lambda: layers)
    first = cache.get()
    assert first is not None and cache.get() is first and cache.is_current()
    with torch.no_grad():  # computing with them changes nothing
        layers[1][2](torch.ones(1, 4))
    assert cache.get() is first


def test_every_kind_of_change_is_seen_in_any_slot() -> None:
    # (``p.weight.data.mul_`` is not seen: ``.data`` has a version counter of its own.)
    changes: dict[str, Callable[[nn.Linear], object]] = {
        "in place": lambda m: torch.no_grad()(m.weight.mul_)(2.0),
        "replaced parameter": lambda m: setattr(m, "weight", nn.Parameter(m.weight.detach())),
        "data reassigned": lambda m: setattr(m.weight, "data", m.weight.detach().clone()),
        "bias added": lambda m: setattr(m, "bias", nn.Parameter(torch.zeros(m.out_features))),
    }
    for name, change in changes.items():
        for layer, proj in ((0, 0), (2, 3)):  # the first projection and the last
            layers = _layers(3)
            cache = _Tuples(lambda layers=layers: layers)
            first = cache.get()
            change(layers[layer][proj])  # type: ignore[arg-type]
            assert not cache.is_current(), (name, layer, proj)
            second = cache.get()
            assert second is not first and second is not None, (name, layer, proj)
            assert second[layer][proj] is layers[layer][proj].weight
