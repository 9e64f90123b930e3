"""``ModuleLinear``: another module's ``nn.Linear`` layers on the model's CPU products."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from _cpu import built
from torch import nn

from deepinfer_kernels.cpu.bf16_weight_linear import Bf16WeightLinear
from deepinfer_kernels.cpu.module_linear import ModuleLinear
from deepinfer_spec import LinearFn


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Bf16WeightLinear:
    return built(Bf16WeightLinear(cache_dir=tmp_path_factory.mktemp("kernels"), enabled=True))


def _layer(in_features: int, out_features: int, bias: bool, exact: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    if exact:  # a bf16 checkpoint loaded into fp32
        with torch.no_grad():
            layer.weight.copy_(layer.weight.bfloat16().float())
    return layer


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("lead", [(1,), (5,), (1, 5), (2, 3), (40,)])
def test_equals_the_module(
    kernel: Bf16WeightLinear, lead: tuple[int, ...], exact: bool, bias: bool
) -> None:
    """Every leading shape, bf16-exact or not, with or without bias: ``layer(x)`` to fp32
    rounding; bf16 panels only for exact weights and at most BF16_MAX_ROWS rows."""
    layer = _layer(48, 40, bias, exact, seed=len(lead))
    x = torch.randn(*lead, 48)
    fn = ModuleLinear(kernel)
    assert isinstance(fn, LinearFn)
    with torch.no_grad():
        got = fn(x, layer)
        torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5)
    rows = x.numel() // 48
    assert fn._packs[layer].has_bf16 == (exact and rows <= 32)


def test_one_pack_per_layer_dropped_with_the_layer(kernel: Bf16WeightLinear) -> None:
    fn = ModuleLinear(kernel)
    a, b = _layer(16, 8, False, True, 0), _layer(16, 8, False, True, 1)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(fn(x, a), F.linear(x, a.weight), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fn(x, b), F.linear(x, b.weight), rtol=1e-5, atol=1e-5)
        pack = fn._packs[a]
        fn(x, a)
        assert fn._packs[a] is pack and len(fn._packs) == 2
        a.weight.mul_(2.0)  # the pack follows the weight, never serves stale panels
        torch.testing.assert_close(fn(x, a), F.linear(x, a.weight), rtol=1e-5, atol=1e-5)
    del a
    gc.collect()
    assert len(fn._packs) == 1


def test_autograd_flows_through_the_module_path(kernel: Bf16WeightLinear) -> None:
    layer = _layer(16, 8, True, True, 2)
    x = torch.randn(3, 16, requires_grad=True)
    fn = ModuleLinear(kernel)
    fn(x, layer).sum().backward()
    assert not fn._packs[layer].has_bf16
    assert layer.weight.grad is not None and x.grad is not None
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(3, 16).detach())


def test_without_the_kernel_the_mkl_paths_answer() -> None:
    layer = _layer(32, 24, True, True, 3)
    fn = ModuleLinear(None)
    for rows in (1, 6):
        x = torch.randn(rows, 32)
        with torch.no_grad():
            torch.testing.assert_close(fn(x, layer), layer(x), rtol=1e-5, atol=1e-5)
    assert not fn._packs[layer].has_bf16
