"""``WeightSnapshot``: the per-step check that a compiled layer's weights are still current."""

from __future__ import annotations

import torch
from torch import nn

from deepinfer_kernels.cpu.decoder_panels import WeightSnapshot


def _modules(count: int) -> list[nn.Linear]:
    return [nn.Linear(4, 3, bias=i % 2 == 0) for i in range(count)]


def _snapshot(modules: list[nn.Linear]) -> WeightSnapshot:
    return WeightSnapshot([m._parameters for m in modules], ("weight", "bias"))


def test_unchanged_weights_stay_current() -> None:
    modules = _modules(5)
    snap = _snapshot(modules)
    assert snap.is_current() and snap.is_current()
    with torch.no_grad():  # reading or computing with them changes nothing
        modules[2](torch.ones(1, 4))
    assert snap.is_current()


def test_every_kind_of_change_is_seen_in_any_slot() -> None:
    changes = {
        # (``m.weight.data.mul_`` is not seen: ``.data`` has its own version counter, as the
        # per-projection check before this one did not see it either.)
        "in place": lambda m: torch.no_grad()(m.weight.mul_)(2.0),
        "replaced parameter": lambda m: setattr(m, "weight", nn.Parameter(m.weight.detach())),
        "data reassigned": lambda m: setattr(m.weight, "data", m.weight.detach().clone()),
        "bias added": lambda m: setattr(m, "bias", nn.Parameter(torch.zeros(3))),
        "bias in place": lambda m: m.bias is not None and torch.no_grad()(m.bias.add_)(1.0),
    }
    for name, change in changes.items():
        for index in (0, 3):  # a module with a bias (0) and one without (3), last slots too
            modules = _modules(4)
            snap = _snapshot(modules)
            if name == "bias in place" and modules[index].bias is None:
                continue
            change(modules[index])
            assert not snap.is_current(), (name, index)


def test_inference_tensors_are_followed_by_identity_and_storage() -> None:
    with torch.inference_mode():
        weights = [torch.ones(2, 2) for _ in range(3)]
    holders = [{"weight": w} for w in weights]
    snap = WeightSnapshot(holders, ("weight", "bias"))
    assert snap.is_current()
    holders[1]["weight"] = weights[1].clone()
    assert not snap.is_current()
