"""CPU benchmark: ``quant_linear`` on GGUF block formats against fp32 ``F.linear`` (same run).

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
