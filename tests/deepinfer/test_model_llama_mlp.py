"""LlamaMLP's silu runs in place on the projection's own buffer: the values are exactly those of
the out-of-place formula, and autograd (which needs silu's input) still gets its gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from model_helpers import tiny_config

from deepinfer.models.llama import LlamaMLP


def _mlp() -> LlamaMLP:
    mlp = LlamaMLP(tiny_config())
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return mlp


def _out_of_place(mlp: LlamaMLP, x: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, mlp.gate_up_proj.weight).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, mlp.down_proj.weight)


def test_in_place_silu_equals_the_formula() -> None:
    mlp = _mlp()
    for rows, mode in ((1, torch.inference_mode), (7, torch.no_grad), (40, torch.inference_mode)):
        x = torch.randn(rows, mlp.gate_up_proj.weight.shape[1])
        before = x.clone()
        with mode():
            got = mlp(x)
        torch.testing.assert_close(got, _out_of_place(mlp, x), rtol=1e-5, atol=1e-6)
        assert torch.equal(x, before)  # the input is not the buffer silu overwrites


def test_gradients_flow_where_autograd_needs_silus_input() -> None:
    mlp = _mlp()
    x = torch.randn(5, mlp.gate_up_proj.weight.shape[1], requires_grad=True)
    mlp(x).square().sum().backward()
    assert x.grad is not None
    x2 = x.detach().clone().requires_grad_(True)
    _out_of_place(mlp, x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-6)
