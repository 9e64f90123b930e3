"""Verification-scheduler benchmark: drafts verified per step and expected throughput vs load.

Model (first principles, no GPU needed). The target is an 8B-parameter dense decoder in bf16 on
one H100-SXM-class GPU (3.35 TB/s HBM, ~990 dense bf16 TFLOP/s):

* weight read per step  t_w = 16.1 GB / (0.8 * 3.35 TB/s)                       ~= 6.0 ms
* compute per verified token t_c = (2 * 8e9 FLOP + attention over a 4k context ~2 GFLOP)
  / (0.5 * 990 TFLOP/s)                                                           ~= 36 us

Step time ``t(B) = t_w + B * t_c`` (``SPSCurve.roofline(..., overlap=0)``: weight streaming and
math are simply added, the brief's "weight-read time + per-token compute"); ``--overlap 1`` gives
the ideal roofline ``max(t_w, B t_c)``. The per-request KV-cache read is not modelled (it depends
on R, not on how many drafts are verified, so it does not move the scheduler's decision much).

Confidences (assumed calibrated by STS, so ``P(accept k | 1..k-1 accepted) = c_k``): per request
a difficulty ``u_r ~ N(0, 1)`` (easy code vs. hard prose) and per position noise
``e_rk ~ N(0, 1)``: ``logit(c_rk) = mu_k + 0.9 u_r + 0.6 e_rk`` with ``mu = (2.2, 1.8, 1.55,
1.35, 1.2)``, i.e. mean conditional acceptance 0.86, 0.81, 0.78, 0.75, 0.73 and an expected
accepted length (bonus included) of 4.0 at gamma = 5 (measured over 200k draws): acceptance decays
along the block, and the shared difficulty term makes a request that is easy at position 1 likely
easy later too, which is what makes confidence-aware scheduling worthwhile.

Run::

    python benchmarks/spec_scheduler.py            # writes the table and docs/img/spec_scheduler.png
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from deepinfer_spec.scheduling import (
    FixedGammaScheduler,
    PrefixScheduler,
    SPSCurve,
    ThresholdScheduler,
    evaluate_schedule,
)

GAMMA = 5
MU = (2.2, 1.8, 1.55, 1.35, 1.2)
ROOT = Path(__file__).resolve().parents[1]


def draw_confidence(r: int, gen: torch.Generator) -> torch.Tensor:
    """[r, GAMMA] confidences from the request-difficulty model in the module docstring."""
    u = torch.randn(r, 1, generator=gen, dtype=torch.float64)
    e = torch.randn(r, GAMMA, generator=gen, dtype=torch.float64)
    return torch.sigmoid(torch.tensor(MU, dtype=torch.float64) + 0.9 * u + 0.6 * e)


def run(args: argparse.Namespace) -> list[dict[str, float]]:
    sps = SPSCurve.roofline(
        args.weight_read_ms * 1e-3, args.per_token_us * 1e-6, overlap=args.overlap
    )
    prefix = PrefixScheduler(sps)
    baselines = {
        "fixed5": FixedGammaScheduler(5),
        "fixed1": FixedGammaScheduler(1),
        "thr": ThresholdScheduler(args.threshold),
    }
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for r in args.loads:
        acc: dict[str, float] = {}
        for _ in range(args.trials):
            conf = draw_confidence(r, gen)
            plan = prefix.plan(conf)
            acc["drafts"] = acc.get("drafts", 0.0) + float(plan.num_draft_tokens.double().mean())
            acc["prefix"] = acc.get("prefix", 0.0) + plan.expected_throughput
            acc["tau"] = acc.get("tau", 0.0) + plan.expected_tau / r
            for name, sched in baselines.items():
                other = evaluate_schedule(conf, sched.schedule(conf), sps)
                acc[name] = acc.get(name, 0.0) + other.expected_throughput
                acc[name + "_tau"] = acc.get(name + "_tau", 0.0) + other.expected_tau / r
        row = {k: v / args.trials for k, v in acc.items()}
        row["R"] = r
        rows.append(row)
    return rows


def table(rows: list[dict[str, float]]) -> str:
    lines = [
        "| R | drafts verified / request | tau/request prefix | tau/request fixed-5 | tok/s prefix | tok/s fixed-5 "
        "| tok/s fixed-1 | gain vs fixed-5 | gain vs fixed-1 | gain vs threshold |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in rows:
        lines.append(
            f"| {int(x['R'])} | {x['drafts']:.2f} | {x['tau']:.2f} | {x['fixed5_tau']:.2f} "
            f"| {x['prefix']:.0f} | {x['fixed5']:.0f} | {x['fixed1']:.0f} "
            f"| {100 * (x['prefix'] / x['fixed5'] - 1):+.1f}% "
            f"| {100 * (x['prefix'] / x['fixed1'] - 1):+.1f}% "
            f"| {100 * (x['prefix'] / x['thr'] - 1):+.1f}% |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = [x["R"] for x in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(loads, [x["drafts"] for x in rows], marker="o")
    ax1.set_xscale("log", base=2)
    ax1.set_ylim(0, GAMMA + 0.3)
    ax1.set_xlabel("concurrent requests R")
    ax1.set_ylabel("draft tokens verified per request")
    ax1.set_title("Prefix scheduler: verified drafts vs load")
    for key, label in (
        ("fixed5", "vs fixed gamma=5"),
        ("fixed1", "vs gamma=1 (MTP-1-like)"),
        ("thr", "vs survival threshold"),
    ):
        ax2.plot(loads, [100 * (x["prefix"] / x[key] - 1) for x in rows], marker="o", label=label)
    ax2.axhline(0, color="grey", linewidth=0.8)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("concurrent requests R")
    ax2.set_ylabel("expected throughput gain (%)")
    ax2.set_title("Prefix scheduler gain")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--weight-read-ms", type=float, default=6.0)
    p.add_argument("--per-token-us", type=float, default=36.0)
    p.add_argument("--overlap", type=float, default=0.0)
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--loads", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24, 32, 48, 64])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "spec_scheduler.png")
    p.add_argument("--no-png", action="store_true")
    args = p.parse_args()
    rows = run(args)
    ridge = args.weight_read_ms * 1e3 / args.per_token_us
    print(
        f"SPS curve: t(B) = {args.weight_read_ms} ms + B * {args.per_token_us} us "
        f"(overlap {args.overlap}, ridge B ~ {math.floor(ridge)}); threshold baseline "
        f"{args.threshold}; {args.trials} batches per load, seed {args.seed}\n"
    )
    print(table(rows))
    if not args.no_png:
        plot(rows, args.png)
        print(f"\nwrote {args.png}")


if __name__ == "__main__":
    main()
