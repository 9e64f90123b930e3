"""CPU benchmark: each compiled CPU op against the torch ops it replaces, in one process.

Shapes of SmolLM2-135M (hidden 576, 9 query / 3 KV heads of 64, MLP 1536), fp32, bf16-exact
weights, a decode step of 1 row and a verification-sized step of 16 rows:

* ``add_rms_norm``: residual add + RMSNorm (torch: ``r = a + b; F.rms_norm(r)``);
* ``bf16_weight_linear``: the gate/up product ``[rows, 576] x [3072, 576]^T`` (torch:
  ``F.linear`` on the fp32 weight);
* ``decoder_layer``: one layer minus its attention, both compiled halves (torch: the same maths
  as the model's torch path: fused QKV product, RoPE, K/V write, o-proj, add, norm, SwiGLU, add,
  next norm).

Run::

    .venv/bin/pytest benchmarks/bench_kernels_cpu.py --benchmark-only -s -p no:xdist

The figure of merit is the ratio (torch time / compiled time) printed by each compiled test;
every compiled result is checked against the torch one first. Skipped without a C compiler.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from deepinfer_kernels.cpu import (
    AddRmsNorm,
    Bf16WeightLinear,
    DecoderLayerKernel,
    LayerPanels,
    LayerShape,
    bf16_panels,
)

H, HQ, HKV, D, INTER, EPS = 576, 9, 3, 64, 1536, 1e-5
ROWS = (1, 16)
_TIMES: dict[str, float] = {}


def _bf16(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 0.05).bfloat16().float()


def _built(kernel: Any) -> Any:
    if not kernel.available():
        pytest.skip("no compiled CPU kernel on this machine")
    return kernel


def _report(benchmark: Any, name: str) -> None:
    _TIMES[name + "/compiled"] = benchmark.stats.stats.median
    base = _TIMES.get(name + "/torch")
    if base is not None:
        fast = _TIMES[name + "/compiled"]
        print(f"\n{name}: torch {base * 1e6:.1f} us, compiled {fast * 1e6:.1f} us "
              f"({base / fast:.2f}x)")  # fmt: skip


# ---------------------------------------------------------------- add_rms_norm
def _norm_inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows)
    return torch.randn(rows, H, generator=g), torch.randn(rows, H, generator=g), torch.rand(H)


@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm_torch(benchmark: Any, rows: int) -> None:
    r, d, w = _norm_inputs(rows)

    def torch_ops() -> torch.Tensor:
        s = r + d
        return F.rms_norm(s, (H,), w, EPS)

    with torch.inference_mode():
        benchmark(torch_ops)
    _TIMES[f"add_rms_norm/{rows}/torch"] = benchmark.stats.stats.median


@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm_compiled(benchmark: Any, rows: int) -> None:
    kernel = _built(AddRmsNorm())
    r, d, w = _norm_inputs(rows)
    with torch.inference_mode():
        _, got = benchmark(kernel, r, d, w, EPS)
        torch.testing.assert_close(got, F.rms_norm(r + d, (H,), w, EPS), atol=1e-5, rtol=1e-5)
    _report(benchmark, f"add_rms_norm/{rows}")


# ---------------------------------------------------------------- bf16 weight linear
def _linear_inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rows)
    return torch.randn(rows, H, generator=g), _bf16(2 * INTER, H, gen=g)


@pytest.mark.parametrize("rows", ROWS)
def test_bf16_weight_linear_torch(benchmark: Any, rows: int) -> None:
    x, w = _linear_inputs(rows)
    with torch.inference_mode():
        benchmark(F.linear, x, w)
    _TIMES[f"bf16_weight_linear/{rows}/torch"] = benchmark.stats.stats.median


@pytest.mark.parametrize("rows", ROWS)
def test_bf16_weight_linear_compiled(benchmark: Any, rows: int) -> None:
    kernel = _built(Bf16WeightLinear())
    x, w = _linear_inputs(rows)
    panels = bf16_panels(w)
    assert panels is not None
    with torch.inference_mode():
        got = benchmark(kernel, x, panels, w.shape[0])
        torch.testing.assert_close(got, F.linear(x, w), atol=1e-4, rtol=1e-4)
    _report(benchmark, f"bf16_weight_linear/{rows}")


# ---------------------------------------------------------------- decoder layer
class _Layer:
    """One layer's weights (dense and as panels) and a step's buffers."""

    def __init__(self, rows: int) -> None:
        g = torch.Generator().manual_seed(20 + rows)
        self.rows = rows
        width = (HQ + 2 * HKV) * D
        self.w = {
            "qkv": _bf16(width, H, gen=g),
            "o": _bf16(H, HQ * D, gen=g),
            "gate_up": _bf16(2 * INTER, H, gen=g),
            "down": _bf16(H, INTER, gen=g),
        }
        p = {k: bf16_panels(v) for k, v in self.w.items()}
        assert all(v is not None for v in p.values())
        self.panels = LayerPanels(p["qkv"], None, p["o"], p["gate_up"], p["down"])  # type: ignore[arg-type]
        self.shape = LayerShape(H, HQ, HKV, D, INTER)
        self.x = torch.randn(rows, H, generator=g)
        self.attn = torch.randn(rows, HQ * D, generator=g)
        self.post, self.next = torch.rand(H, generator=g), torch.rand(H, generator=g)
        angles = torch.rand(rows, D // 2, generator=g)
        self.cos = torch.cat([angles.cos()] * 2, -1)
        self.sin = torch.cat([-angles.sin(), angles.sin()], -1)
        self.k_cache = torch.zeros(64, 16, HKV, D)
        self.v_cache = torch.zeros(64, 16, HKV, D)
        self.slots = torch.arange(rows, dtype=torch.int64) * 7

    def torch_ops(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows, w = self.rows, self.w
        heads = F.linear(self.x, w["qkv"]).view(rows, HQ + 2 * HKV, D)
        qk = heads[:, : HQ + HKV]
        qk = (
            qk * self.cos[:, None]
            + torch.cat([qk[..., D // 2 :], qk[..., : D // 2]], -1) * (self.sin[:, None])
        )
        self.k_cache.view(-1, HKV, D).index_copy_(0, self.slots, qk[:, HQ:])
        self.v_cache.view(-1, HKV, D).index_copy_(0, self.slots, heads[:, HQ + HKV :])
        r = self.x + F.linear(self.attn, w["o"])
        n = F.rms_norm(r, (H,), self.post, EPS)
        gate, up = F.linear(n, w["gate_up"]).chunk(2, -1)
        r = r + F.linear(F.silu(gate) * up, w["down"])
        return qk[:, :HQ], F.rms_norm(r, (H,), self.next, EPS)


@pytest.mark.parametrize("rows", ROWS)
def test_decoder_layer_torch(benchmark: Any, rows: int) -> None:
    layer = _Layer(rows)
    with torch.inference_mode():
        benchmark(layer.torch_ops)
    _TIMES[f"decoder_layer/{rows}/torch"] = benchmark.stats.stats.median


@pytest.mark.parametrize("rows", ROWS)
def test_decoder_layer_compiled(benchmark: Any, rows: int) -> None:
    kernel = _built(DecoderLayerKernel())
    layer = _Layer(rows)
    shape = layer.shape
    qkv = torch.empty(rows, shape.qkv_width)
    residual, normed = layer.x.clone(), torch.empty(rows, H)
    scratch = torch.empty(shape.scratch_size(rows))
    slots = kernel.slot_mapping(layer.slots, 64 * 16)
    bound = kernel.bind(shape, (layer.panels,), normed, qkv, layer.cos, layer.sin, slots,
                        [layer.k_cache], [layer.v_cache], layer.attn, residual,
                        [(layer.post, layer.next)], EPS, scratch)  # fmt: skip

    def compiled() -> None:
        residual.copy_(layer.x)
        normed.copy_(layer.x)
        bound.qkv(0)
        bound.mlp(0)

    with torch.inference_mode():
        benchmark(compiled)
        q_want, normed_want = layer.torch_ops()
        torch.testing.assert_close(qkv.view(rows, -1, D)[:, :HQ], q_want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(normed, normed_want, atol=1e-4, rtol=1e-4)
    _report(benchmark, f"decoder_layer/{rows}")
