"""CPU benchmark: ``quant_linear`` on GGUF block formats against fp32 ``F.linear`` (same run),
and the whole block-format decoder layer against the per-op path it replaced (end of file).

Shape: SmolLM2-135M's fused gate/up projection (``[3072, 576]``; Q4_K rows need multiples of
256, so K-quants use ``[3072, 768]``), 1 row (decode), 16 rows (verification / small batch)
and 128 rows (a prefill chunk). The baseline is MKL's fp32 product with the same weights
dequantised once up front (what the engine ran before: the weights held as fp32). One
intra-op thread on both sides (see ``bench_kernels_verify.py`` on oversubscribed machines).
Run::

    .venv/bin/pytest benchmarks/bench_kernels_quant.py --benchmark-only -q -s

Each ``ours`` test prints ``fp32 median / ours median`` (> 1: the quantised product is faster).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from deepinfer_kernels.quant import QuantType, QuantWeight, dequantize, quant_linear
from deepinfer_kernels.testing.quant import product_tolerance, random_quant_rows

N = 3072
CASES = [
    (qtype, rows)
    for qtype in (QuantType.Q4_1, QuantType.Q8_0, QuantType.Q4_K, QuantType.Q6_K)
    for rows in (1, 16, 128)
]
_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _weight(qtype: QuantType) -> QuantWeight:
    cols = 576 if qtype in (QuantType.Q4_1, QuantType.Q8_0) else 768
    return QuantWeight(random_quant_rows(qtype, N, cols, seed=0), qtype, cols)


@pytest.mark.parametrize(("qtype", "rows"), CASES, ids=[f"{q.name}-{r}" for q, r in CASES])
def test_fp32_baseline(benchmark, qtype, rows):  # type: ignore[no-untyped-def]
    w = _weight(qtype)
    wf, x = dequantize(w), torch.randn(rows, w.cols)
    out = benchmark(F.linear, x, wf)
    _TIMES[f"fp32-{qtype.name}-{rows}"] = benchmark.stats.stats.median
    assert out.shape == (rows, N)


@pytest.mark.parametrize(("qtype", "rows"), CASES, ids=[f"{q.name}-{r}" for q, r in CASES])
def test_quant_ours(benchmark, qtype, rows):  # type: ignore[no-untyped-def]
    w = _weight(qtype)
    x = torch.randn(rows, w.cols)
    out = benchmark(quant_linear, x, w)
    wf = dequantize(w)
    assert ((out - x @ wf.t()).abs() <= 2 * product_tolerance(x, wf)).all()
    key = f"fp32-{qtype.name}-{rows}"
    if key in _TIMES:
        ratio = _TIMES[key] / benchmark.stats.stats.median
        print(f"\nquant_linear {qtype.name} x {rows} rows: {ratio:.2f}x fp32 F.linear")


# ---------------------------------------------------------------- more than two rows (panels)
# The C kernel's T > 2 path (quant/csrc/gguf_panel.h: 12-row panels dequantised into an fp32
# tile, a 2 x 6 register-blocked micro-kernel) called directly at 16 rows (a 16-request decode
# step) and 512 rows (a prefill chunk), against MKL's fp32 product over weights dequantised up
# front (``fp32``) and over weights dequantised on every call (``deq+mkl``: what quant_linear
# runs above GEMV_MAX_ROWS rows). Run: ``... bench_kernels_quant.py --benchmark-only -q -s -k panel``.
PANEL_CASES = [(q, r) for q in (QuantType.Q4_1, QuantType.Q4_K) for r in (16, 512)]
_PANEL_IDS = [f"{q.name}-{r}" for q, r in PANEL_CASES]


@pytest.mark.parametrize("way", ["fp32", "deq+mkl", "panel"])
@pytest.mark.parametrize(("qtype", "rows"), PANEL_CASES, ids=_PANEL_IDS)
def test_panel_product(benchmark, qtype, rows, way):  # type: ignore[no-untyped-def]
    from deepinfer_kernels.quant import QuantGemvKernel

    kernel = QuantGemvKernel()
    if not kernel.available():
        pytest.skip("no compiled CPU kernel on this machine")
    w = _weight(qtype)
    wf, x = dequantize(w), torch.randn(rows, w.cols)
    run = {
        "fp32": lambda: F.linear(x, wf),
        "deq+mkl": lambda: F.linear(x, dequantize(w)),
        "panel": lambda: kernel.linear(x, w.data, qtype, w.cols, None),
    }[way]
    out = benchmark(run)
    assert ((out - x @ wf.t()).abs() <= 2 * product_tolerance(x, wf)).all()
    median = benchmark.stats.stats.median
    _TIMES[f"panel-{way}-{qtype.name}-{rows}"] = median
    if way == "panel":
        fp32 = _TIMES.get(f"panel-fp32-{qtype.name}-{rows}")
        deq = _TIMES.get(f"panel-deq+mkl-{qtype.name}-{rows}")
        if fp32 is not None and deq is not None:
            print(
                f"\npanel {qtype.name} x {rows} rows: {median * 1e6:.0f} us; {fp32 / median:.2f}x"
                f" fp32 MKL (weights dequantised up front), {deq / median:.2f}x dequantise+MKL"
            )


# ---------------------------------------------------------------- whole decoder layer
# SmolLM2-135M's layer (hidden 576, 9 query / 3 KV heads of 64, MLP 1536) on GGUF weights: the
# per-op path a GGUF model ran before the fused layer (one quant_linear per projection, torch
# ops between) against QuantDecoderLayerKernel's two calls, Q4_1 (the embedded model's type)
# and BF16 (a bf16 checkpoint run from its own tensors), 1 and 16 rows.
H, HQ, HKV, D, INTER, EPS = 576, 9, 3, 64, 1536, 1e-5
LAYER_CASES = [(q, r) for q in (QuantType.Q4_1, QuantType.BF16) for r in (1, 16)]


class _QuantLayer:
    def __init__(self, qtype: QuantType, rows: int) -> None:
        from deepinfer_kernels.cpu import BlockMatrix, LayerBlocks, LayerShape

        g = torch.Generator().manual_seed(rows)

        def part(n: int, k: int, seed: int) -> QuantWeight:
            return QuantWeight(random_quant_rows(qtype, n, k, seed, 0.05), qtype, k)

        self.rows, self.shape = rows, LayerShape(H, HQ, HKV, D, INTER)
        self.w = {"qkv": part((HQ + 2 * HKV) * D, H, 1), "o": part(H, HQ * D, 2),
                  "gate_up": part(2 * INTER, H, 3), "down": part(H, INTER, 4)}  # fmt: skip
        m = {k: BlockMatrix.of(v) for k, v in self.w.items()}
        self.blocks = LayerBlocks(m["qkv"], None, m["o"], m["gate_up"], m["down"])
        self.x = torch.randn(rows, H, generator=g)
        self.attn = torch.randn(rows, HQ * D, generator=g)
        self.post, self.next = torch.rand(H, generator=g), torch.rand(H, generator=g)
        angles = torch.rand(rows, D // 2, generator=g)
        self.cos = torch.cat([angles.cos()] * 2, -1)
        self.sin = torch.cat([-angles.sin(), angles.sin()], -1)
        self.k_cache, self.v_cache = torch.zeros(64, 16, HKV, D), torch.zeros(64, 16, HKV, D)
        self.slots = torch.arange(rows, dtype=torch.int64) * 7

    def per_op(self) -> torch.Tensor:
        w, rows = self.w, self.rows
        heads = quant_linear(self.x, w["qkv"]).view(rows, HQ + 2 * HKV, D)
        qk = heads[:, : HQ + HKV]
        qk = (
            qk * self.cos[:, None]
            + torch.cat([qk[..., D // 2 :], qk[..., : D // 2]], -1) * (self.sin[:, None])
        )
        self.k_cache.view(-1, HKV, D).index_copy_(0, self.slots, qk[:, HQ:])
        self.v_cache.view(-1, HKV, D).index_copy_(0, self.slots, heads[:, HQ + HKV :])
        r = self.x + quant_linear(self.attn, w["o"])
        n = F.rms_norm(r, (H,), self.post, EPS)
        gate, up = quant_linear(n, w["gate_up"]).chunk(2, -1)
        r = r + quant_linear(F.silu(gate) * up, w["down"])
        return F.rms_norm(r, (H,), self.next, EPS)


@pytest.mark.parametrize(
    ("qtype", "rows"), LAYER_CASES, ids=[f"{q.name}-{r}" for q, r in LAYER_CASES]
)
def test_layer_per_op(benchmark, qtype, rows):  # type: ignore[no-untyped-def]
    layer = _QuantLayer(qtype, rows)
    with torch.inference_mode():
        benchmark(layer.per_op)
    _TIMES[f"layer-per-op-{qtype.name}-{rows}"] = benchmark.stats.stats.median


@pytest.mark.parametrize(
    ("qtype", "rows"), LAYER_CASES, ids=[f"{q.name}-{r}" for q, r in LAYER_CASES]
)
def test_layer_fused(benchmark, qtype, rows):  # type: ignore[no-untyped-def]
    from deepinfer_kernels.cpu import QuantDecoderLayerKernel

    kernel = QuantDecoderLayerKernel()
    if not kernel.available():
        pytest.skip("no compiled CPU kernel on this machine")
    layer = _QuantLayer(qtype, rows)
    shape = layer.shape
    qkv = torch.empty(rows, shape.qkv_width)
    residual, normed = layer.x.clone(), torch.empty(rows, H)
    scratch = torch.empty(shape.scratch_size(rows))
    slots = kernel.slot_mapping(layer.slots, 64 * 16)
    bound = kernel.bind(shape, (layer.blocks,), normed, qkv, layer.cos, layer.sin, slots,
                        [layer.k_cache], [layer.v_cache], layer.attn, residual,
                        [(layer.post, layer.next)], EPS, scratch)  # fmt: skip

    def fused() -> None:
        residual.copy_(layer.x)
        normed.copy_(layer.x)
        bound.qkv(0)
        bound.mlp(0)

    with torch.inference_mode():
        benchmark(fused)
        # The MLP half's output, from the same attention and residual, against the per-op path.
        want = layer.per_op()
        torch.testing.assert_close(normed, want, atol=1e-4, rtol=1e-4)
    median = benchmark.stats.stats.median
    _TIMES[f"layer-fused-{qtype.name}-{rows}"] = median
    base = _TIMES.get(f"layer-per-op-{qtype.name}-{rows}")
    if base is not None:
        print(f"\nlayer {qtype.name} x {rows} rows: fused {median * 1e6:.0f} us, per-op "
              f"{base * 1e6:.0f} us ({base / median:.2f}x)")  # fmt: skip
    q41 = _TIMES.get(f"layer-fused-Q4_1-{rows}")
    if qtype == QuantType.BF16 and q41 is not None:
        print(f"layer BF16 / Q4_1 speed x {rows} rows: {q41 / median:.2f}x")
