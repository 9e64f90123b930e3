"""The many-row GEMM's BLAS, A/B in one process: MKL vs numpy's OpenBLAS (``quant/dense_gemm.py``).

Runs ``benchmarks/vs_llamacpp.py``'s 16-concurrent workload (16 code-editing prompts of ~76
tokens, ``--new`` tokens each, greedy) through ``LLM.generate`` on the embedded Q4_1 model,
alternating ``DEEPINFER_DENSE_GEMM=mkl`` and ``=openblas`` ``--repeats`` times (the order flips
every repeat), and prints each run and the ratios MKL time / OpenBLAS time, median (range).

It also splits the run: the same prompts with 1 new token (the prefill step and one sample)
against ``--new`` tokens, so the decode steps' share is the difference.

With ``--threads 1`` it times CPU seconds of this process (robust to other processes on a
loaded machine); with more threads, wall time.

``--gemm-only`` times just ``quant_linear`` (dequantisation + GEMM) on SmolLM2's four prefill
shapes of Q4_1 weights (QKV 960, O 576, gate/up 3072 over K = 576; down 576 over K = 1536) at
``--rows`` rows, both backends alternated ``--repeats`` times, each round two calls a shape.

    .venv/bin/python benchmarks/prefill_blas_ab.py --threads 1 --repeats 4
    .venv/bin/python benchmarks/prefill_blas_ab.py --threads 1 --gemm-only --repeats 12
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--new", type=int, default=16, help="new tokens per prompt")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--gemm-only", action="store_true", help="time the GEMMs alone")
    parser.add_argument("--rows", type=int, default=1222, help="--gemm-only: rows of x")
    args = parser.parse_args()
    if args.gemm_only:
        return _gemm_only(args.threads, args.rows, args.repeats)
    sys.path.insert(0, str(Path(__file__).parent))
    from vs_llamacpp import CODE_PROMPT, Ours

    from deepinfer import SamplingParams
    from deepinfer.models import default_model_path
    from deepinfer_kernels.quant.dense_gemm import default_dense_gemm

    clock = time.process_time if args.threads == 1 else time.perf_counter
    ours = Ours(default_model_path(), args.threads, 2048 + 128)
    prompts = [ours.tokens(f"Question {i}: " + CODE_PROMPT) for i in range(args.batch)]

    def use(backend: str) -> None:
        os.environ["DEEPINFER_DENSE_GEMM"] = backend
        default_dense_gemm.cache_clear()
        assert default_dense_gemm().backend_for(args.threads) == backend

    def run(new: int) -> tuple[float, list[list[int]]]:
        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        start = clock()
        outs = ours.llm.generate(prompts, params)
        return clock() - start, [list(o.token_ids) for o in outs]

    backends = ("mkl", "openblas")
    tokens = {}
    for b in backends:  # warm-up, and the greedy tokens of each
        use(b)
        tokens[b] = run(args.new)[1]
    print(f"same greedy tokens on both: {tokens['mkl'] == tokens['openblas']}")
    full: dict[str, list[float]] = {b: [] for b in backends}
    first: dict[str, list[float]] = {b: [] for b in backends}
    for r in range(args.repeats):
        for b in backends if r % 2 == 0 else backends[::-1]:
            use(b)
            first[b].append(run(1)[0])
            full[b].append(run(args.new)[0])
            print(f"run {r + 1} {b}: 1 token {first[b][-1]:.2f} s, {args.new} tokens "
                  f"{full[b][-1]:.2f} s", flush=True)  # fmt: skip
    unit = "CPU-s" if args.threads == 1 else "s"
    for b in backends:
        p, f = statistics.median(first[b]), statistics.median(full[b])
        print(f"{b}: prefill step + 1 token {p:.2f} {unit} ({p / f:.0%} of the run), "
              f"{args.new - 1} decode steps {f - p:.2f} {unit}")  # fmt: skip
    ratios = sorted(a / b for a, b in zip(full["mkl"], full["openblas"], strict=True))
    print(f"whole run, MKL / OpenBLAS time: {statistics.median(ratios):.2f}x "
          f"({ratios[0]:.2f}-{ratios[-1]:.2f})")  # fmt: skip
    pre = sorted(a / b for a, b in zip(first["mkl"], first["openblas"], strict=True))
    print(f"prefill step, MKL / OpenBLAS time: {statistics.median(pre):.2f}x "
          f"({pre[0]:.2f}-{pre[-1]:.2f})")  # fmt: skip
    return 0


def _gemm_only(threads: int, rows: int, repeats: int) -> int:
    import torch

    from deepinfer_kernels.quant import QuantType, QuantWeight, quant_linear
    from deepinfer_kernels.quant.dense_gemm import default_dense_gemm
    from deepinfer_kernels.testing.quant import random_quant_rows

    torch.set_num_threads(threads)
    clock = time.process_time if threads == 1 else time.perf_counter
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    operands = [
        (torch.randn(rows, k), QuantWeight(random_quant_rows(QuantType.Q4_1, n, k, seed=n + k),
                                           QuantType.Q4_1, k))
        for n, k in shapes
    ]  # fmt: skip
    flops = 2 * 2 * rows * sum(n * k for n, k in shapes)
    times: dict[str, list[float]] = {"mkl": [], "openblas": []}
    for r in range(repeats):
        for b in times if r % 2 == 0 else list(times)[::-1]:
            os.environ["DEEPINFER_DENSE_GEMM"] = b
            default_dense_gemm.cache_clear()
            start = clock()
            for x, w in operands:  # dequantise + GEMM, as quant_linear runs a prefill
                quant_linear(x, w)
                quant_linear(x, w)
            times[b].append(clock() - start)
    for b in times:
        print(f"{b}: {flops / statistics.median(times[b]) / 1e9:.1f} GFLOP/s (median)")
    ratios = sorted(a / b for a, b in zip(times["mkl"], times["openblas"], strict=True))
    print(f"{rows} rows, {threads} threads, MKL / OpenBLAS time: {statistics.median(ratios):.2f}x "
          f"({ratios[0]:.2f}-{ratios[-1]:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
