"""CPU benchmark (#23 item 3): the rejection sampling kernel against the bisection kernel it
replaced (``_sampling_bisection_kernel.py``), both under the Triton interpreter, same process,
same inputs, interleaved repetitions.

On CPU the interpreter runs each program's vocabulary passes in Python, so time follows the
number of passes over the vocabulary: the figure that carries over to a GPU, where a sampling
row is bandwidth-bound and each pass re-reads the row's logits. Both are reported: passes
(bisection: 1 + 32 per top-k + 33 per top-p + 2; rejection: 1 + 2 per round) and the median
time per call, with the ratio bisection / rejection and its range over the repetitions.

Run::

    .venv/bin/python benchmarks/bench_kernels_sampling.py [--vocab 8192] [--batch 32] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: CPU runs the interpreter

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sampling_bisection_kernel import sample_bisection

from deepinfer_kernels.sampling.triton_sampling import sample_triton

SETTINGS = {  # name: (temperature, top_k, top_p, min_p)
    "plain (T=1)": (1.0, 0, 1.0, 0.0),
    "top-k 50": (0.8, 50, 1.0, 0.0),
    "top-p 0.9": (0.8, 0, 0.9, 0.0),
    "top-k 50 + top-p 0.9": (0.8, 50, 0.9, 0.0),
    "top-k 50 + top-p 0.9 + min-p 0.05": (0.8, 50, 0.9, 0.05),
}


def bisection_passes(top_k: int, top_p: float, min_p: float, vocab: int) -> int:
    k_on, p_on = 0 < top_k < vocab, top_p < 1.0
    return 1 + 32 * k_on + 33 * p_on + (k_on or p_on or min_p > 0) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    # A long-tailed row: a few likely tokens over a Gaussian tail, like LM logits.
    logits = 2.5 * torch.randn(args.batch, args.vocab, generator=g)
    print(
        f"# sampling kernels on the Triton interpreter (CPU), batch {args.batch}, "
        f"vocab {args.vocab}, {args.reps} interleaved reps\n"
    )
    print("| setting | passes bisection | passes rejection (mean rounds) | bisection ms | "
          "rejection ms | speed-up (range) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, (t, k, p, m) in SETTINGS.items():
        b = args.batch
        params = (
            torch.full((b,), t), torch.full((b,), k), torch.full((b,), p), torch.full((b,), m)
        )  # fmt: skip
        u = torch.rand(b, generator=g)
        seed = torch.tensor([1], dtype=torch.int64)
        rounds = torch.zeros(b, dtype=torch.int32)
        old_t, new_t = [], []
        for _ in range(args.reps):
            start = time.perf_counter()
            sample_bisection(logits, *params, u)
            old_t.append(time.perf_counter() - start)
            start = time.perf_counter()
            sample_triton(logits, *params, u, seed, rounds)
            new_t.append(time.perf_counter() - start)
        mean_rounds = float(rounds.float().mean())
        max_rounds = int(rounds.max())
        # One sampling pass per round, plus a counting pass when the row filters.
        per_round = 2 if (0 < k < args.vocab or p < 1.0 or m > 0) else 1
        ratios = sorted(o / n for o, n in zip(old_t, new_t, strict=True))
        print(
            f"| {name} | {bisection_passes(k, p, m, args.vocab)} | "
            f"{1 + per_round * mean_rounds:.1f} ({mean_rounds:.2f}, max {max_rounds}) | "
            f"{statistics.median(old_t) * 1e3:.0f} | {statistics.median(new_t) * 1e3:.0f} | "
            f"{statistics.median(old_t) / statistics.median(new_t):.1f}x "
            f"({ratios[0]:.1f}-{ratios[-1]:.1f}) |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
