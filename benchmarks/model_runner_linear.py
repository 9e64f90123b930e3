"""CPU projections of the embedded SmolLM2-135M: ``F.linear`` vs ``deepinfer_kernels.cpu.linear``.

Usage: python benchmarks/model_runner_linear.py [--threads 2] [--out results/model_runner_linear.md]

Runs all 121 projections of one forward (30 layers x QKV, O, gate/up, down, plus the tied LM
head) at several row counts, in the same process, best of 5, five ways: plain ``F.linear``
(what transformers runs), ``linear`` without a pack (the transposed product ``(W x^T)^T`` for
the row counts in ``CPU_TRANSPOSED_ROWS``), ``linear`` with MKL-packed weights only (from
``PACKED_MIN_ROWS`` rows on), the bf16-weight kernel at every row count (the embedded model's
weights are bf16-exact), and ``linear`` as the model runner calls it (the kernel up to
``BF16_MAX_ROWS`` rows, packed above).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from deepinfer.models import load_model
from deepinfer_kernels.cpu.bf16_weight_linear import Bf16WeightLinear, bf16_panels
from deepinfer_kernels.cpu.linear import PackedWeight, linear, mkl_packing_available

ROWS = (1, 2, 3, 4, 6, 8, 16, 32, 48, 64, 128, 256, 512)


def _best_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model().model
    weights = [model.lm_head_weight.detach()]
    for layer in model.decoder_layers():
        attn, mlp = layer.self_attn, layer.mlp
        for w in (attn.qkv_proj.weight, attn.o_proj.weight, mlp.gate_up_proj.weight):
            weights.append(w.detach())
        weights.append(mlp.down_proj.weight.detach())
    weights = [w.float() for w in weights]
    packs = [PackedWeight() for _ in weights]
    kernel = Bf16WeightLinear(enabled=True)
    if not kernel.available():
        raise SystemExit(f"the bf16-weight kernel is unavailable: {kernel.error}")
    panels = [bf16_panels(w) for w in weights]
    if any(p is None for p in panels):
        raise SystemExit("the model's weights are not bf16-exact")
    runner_packs = [PackedWeight(kernel) for _ in weights]
    if not mkl_packing_available():
        print("this torch build has no MKL packed GEMM: the packed column repeats `linear`")
    lines = [
        "| rows | F.linear ms | transposed ms | packed ms | bf16 kernel ms | model runner ms "
        "| packed speed-up | model runner speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with torch.inference_mode():
        for rows in ROWS:
            xs = [torch.randn(rows, w.shape[1]) for w in weights]
            base = _best_ms(lambda xs=xs: [F.linear(x, w) for x, w in zip(xs, weights)])
            ours = _best_ms(lambda xs=xs: [linear(x, w) for x, w in zip(xs, weights)])
            packed = _best_ms(
                lambda xs=xs: [linear(x, w, pack=p) for x, w, p in zip(xs, weights, packs)]
            )
            bf16 = _best_ms(
                lambda xs=xs: [
                    kernel(x, p, w.shape[0])  # type: ignore[arg-type]
                    for x, p, w in zip(xs, panels, weights)
                ]
            )
            runner = _best_ms(
                lambda xs=xs: [linear(x, w, pack=p) for x, w, p in zip(xs, weights, runner_packs)]
            )
            lines.append(
                f"| {rows} | {base:.1f} | {ours:.1f} | {packed:.1f} | {bf16:.1f} | {runner:.1f} "
                f"| {base / packed:.2f}x | {base / runner:.2f}x |"
            )
            print(lines[-1], flush=True)
    cmd = ".venv/bin/python " + " ".join(sys.argv)
    report = "\n".join(
        [
            "# CPU projections: F.linear vs deepinfer_kernels.cpu.linear",
            "",
            f"Command: `{cmd}` (torch threads {args.threads}, fp32, all 121 projections of one "
            "SmolLM2-135M forward, best of 5).",
            "",
            *lines,
            "",
            "Rows outside `CPU_TRANSPOSED_ROWS` (4..48) run the same `F.linear` call in the first",
            "two columns: their ratio is this machine's run-to-run noise. The packed column is",
            "`F.linear` again below `PACKED_MIN_ROWS` (4). The bf16 kernel reads the weights as",
            "bf16 (exact: they came from a bf16 checkpoint) and computes in fp32; the model runner",
            "uses it up to `BF16_MAX_ROWS` rows.",
        ]
    )
    if args.out is not None:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
