"""DSpark drafter figures on the test target: tau before/after training, and the window's saving.

1. tau (mean tokens emitted per step, bonus included, all gamma = 4 drafts verified) of a
   drafter for the tiny random target used by the tests, untrained and after a short CPU
   training run on sequences sampled from the target (self-distillation), at temperature 1 and
   greedy.
2. The drafter recompute saved by the sliding window: per step the drafter projects keys and
   values for, and attends over, ``W + gamma`` positions per layer. With the window ``W = 128``;
   a full-context drafter needs ``W = N`` (the whole context). The table gives the analytic
   key/value positions per step and the measured time of one propose() (same process, same
   weights, ratio full/window) for contexts N = 256 .. 8192, batch 8, hidden 256.

Run (CPU, about two minutes)::

    .venv/bin/python benchmarks/spec_tau.py            # prints markdown tables
"""

from __future__ import annotations

import argparse
import time

import torch

from deepinfer_spec import DSparkConfig, DSparkDrafter, propose
from deepinfer_spec.testing import TinyTarget
from deepinfer_spec.training import (
    TrainConfig,
    evaluate,
    sample_from_target,
    train_drafter,
)


def tau_table(steps: int, seed: int) -> str:
    model = TinyTarget(vocab_size=32, hidden_size=32, num_layers=2, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    data = sample_from_target(model, 128, 48, generator=gen)
    prompts = [s[:8] for s in sample_from_target(model, 32, 8, generator=gen)]
    cfg = DSparkConfig(
        target_layer_ids=(0, 1), gamma=4, window=16, num_layers=1, markov_rank=32, num_heads=4
    )
    torch.manual_seed(seed)
    drafter = DSparkDrafter(cfg, model)
    rows = []

    def measure(label: str) -> None:
        for temp in (1.0, 0.0):
            rep = evaluate(drafter, model, prompts, max_new_tokens=32, temperature=temp, seed=seed)
            acc = " / ".join(f"{a:.2f}" for a in rep.acceptance)
            rows.append(
                f"| {label} | {temp:g} | {rep.tau:.2f} | {acc} | {rep.ece_before:.3f} | "
                f"{rep.ece_after:.3f} |"
            )

    measure("untrained")
    t0 = time.perf_counter()
    train_drafter(
        model,
        data,
        None,
        TrainConfig(steps=steps, batch_size=8, anchors_per_sequence=8, lr=3e-3, progress=False),
        drafter=drafter,
    )
    secs = time.perf_counter() - t0
    measure(f"trained ({steps} steps, {secs:.0f} s CPU)")
    head = (
        "| drafter | temperature | tau | acceptance k=1..4 | survival ECE | ECE after STS |\n"
        "|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(rows)


@torch.no_grad()
def window_table(contexts: list[int], batch: int, hidden: int, repeats: int) -> str:
    model = TinyTarget(vocab_size=512, hidden_size=hidden, num_layers=2, num_heads=8, seed=0)
    rows = []
    gamma = 5
    for n in contexts:
        times = {}
        for label, window in (("window 128", min(128, n)), ("full context", n)):
            cfg = DSparkConfig(
                target_layer_ids=(0, 1), gamma=gamma, window=window, num_layers=2, num_heads=8,
                markov_rank=64,
            )  # fmt: skip
            torch.manual_seed(0)
            d = DSparkDrafter(cfg, model).eval()
            ctx = d.project_context(torch.randn(batch, window, d.feature_dim))
            valid = torch.ones(batch, window, dtype=torch.bool)
            anchors = torch.randint(0, 512, (batch,))
            propose(d, anchors, ctx, valid)  # warm-up
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                propose(d, anchors, ctx, valid)
                best = min(best, time.perf_counter() - t0)
            times[label] = best
        w, f = times["window 128"], times["full context"]
        rows.append(
            f"| {n} | {min(128, n) + gamma} | {n + gamma} | "
            f"{(n + gamma) / (min(128, n) + gamma):.1f}x | {w * 1e3:.2f} | {f * 1e3:.2f} | "
            f"{f / w:.1f}x |"
        )
    head = (
        "| context N | KV positions/layer (window) | (full) | analytic saving | "
        "propose ms (window) | propose ms (full) | measured ratio |\n|---|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--contexts", default="256,1024,4096,8192")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("## tau on the test target\n")
    print(tau_table(args.steps, args.seed))
    print("\n## drafter recompute: sliding window vs full context (batch 8, hidden 256)\n")
    contexts = [int(x) for x in args.contexts.split(",")]
    print(window_table(contexts, batch=8, hidden=256, repeats=args.repeats))


if __name__ == "__main__":
    main()
