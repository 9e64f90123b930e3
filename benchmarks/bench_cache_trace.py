"""Trace replay: a synthetic chat/agent trace with ~96% reusable input tokens, replayed through
``TieredKVStore``; token hit rate against capacity per tier, plus a PNG plot.

    .venv/bin/python benchmarks/bench_cache_trace.py [--conversations 80] [--png docs/img/cache_hit_rate.png]

Trace: conversations start at random times over a day (fake clock) and come back after
exponential think times. Each request's input is the conversation's shared system prompt plus
its whole history plus a new user message (chat) or tool output (agent); after the reply the
whole sequence (input + output) is stored, as an engine does after decode. Reusable input
tokens = tokens of an earlier request's stored sequence that prefix this input.
"""

from __future__ import annotations

import argparse
import heapq
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer_cache import DeviceTier, DiskTier, FakeClock, HostTier, TieredKVStore

BLOCK = 16
PAGE = (1,)  # pages are placeholders: the replay measures placement, not bytes
PAGE_BYTES = 2


@dataclass
class Request:
    time: float
    tokens: list[int]  # input
    output: list[int]
    retention: str
    reusable: int


def make_trace(n_conv: int, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    systems = {
        "chat": [rng.integers(0, 50_000, 1500).tolist() for _ in range(3)],
        "agent": [rng.integers(0, 50_000, 3000).tolist() for _ in range(2)],
    }
    seen_sys: set[tuple[str, int]] = set()
    events: list[tuple[float, int, int]] = []
    convs = []
    for c in range(n_conv):
        kind = "agent" if rng.random() < 0.4 else "chat"
        turns = int(rng.integers(6, 14) if kind == "chat" else rng.integers(10, 22))
        sys_id = int(rng.integers(len(systems[kind])))
        convs.append((kind, sys_id, turns))
        heapq.heappush(events, (float(rng.uniform(0, 86_400)), c, 0))
    history: dict[int, list[int]] = {}
    out: list[Request] = []
    while events:
        t, c, turn = heapq.heappop(events)
        kind, sys_id, turns = convs[c]
        new = int(rng.integers(60, 200) if kind == "chat" else rng.integers(120, 360))
        reply = int(rng.integers(150, 400) if kind == "chat" else rng.integers(60, 200))
        prev = history.get(c)
        if prev is None:
            prev = list(systems[kind][sys_id])
            reusable = len(prev) if (kind, sys_id) in seen_sys else 0
            seen_sys.add((kind, sys_id))
        else:
            reusable = len(prev)
        tokens = prev + rng.integers(0, 50_000, new).tolist()
        output = rng.integers(0, 50_000, reply).tolist()
        out.append(Request(t, tokens, output, kind, reusable))
        history[c] = tokens + output
        if turn + 1 < turns:
            heapq.heappush(events, (t + float(rng.exponential(300.0)), c, turn + 1))
    return out


def replay(
    trace: list[Request], caps: tuple[int, int, int], tmp: str
) -> tuple[float, dict[str, int]]:
    """Replay with (device, host, disk) capacities in blocks (0 = tier absent)."""
    clock = FakeClock(0.0)
    tiers: list = []
    if caps[0]:
        tiers.append(DeviceTier.allocate(PAGE, torch.float16, caps[0] * PAGE_BYTES))
    if caps[1]:
        tiers.append(HostTier(PAGE, torch.float16, caps[1] * PAGE_BYTES))
    if caps[2]:
        tiers.append(DiskTier(tmp, PAGE, torch.float16, caps[2] * (PAGE_BYTES + 512), fsync=False))
    store = TieredKVStore(tiers, BLOCK, clock=clock, persist_on_close=False)
    per_tier = {t.name: 0 for t in tiers}
    for r in trace:
        clock.advance(max(0.0, r.time - clock.now()))
        res = store.lookup(r.tokens)
        for k, v in res.blocks_per_tier.items():
            per_tier[k] += v * BLOCK
        seq = r.tokens + r.output
        store.store(seq, lambda idx: torch.zeros(len(idx), *PAGE, dtype=torch.float16), r.retention)
    rate = store.stats().hit_rate
    store.close()
    return rate, per_tier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--conversations", type=int, default=80)
    ap.add_argument("--png", default="docs/img/cache_hit_rate.png")
    args = ap.parse_args()
    t0 = time.perf_counter()
    trace = make_trace(args.conversations)
    total = sum(len(r.tokens) for r in trace)
    reusable = sum(r.reusable for r in trace) / total
    unique = sum(len(r.tokens) + len(r.output) - r.reusable for r in trace) // BLOCK
    print(
        f"trace: {len(trace)} requests, mean input {total / len(trace):,.0f} tokens, "
        f"reusable input tokens {reusable:.2%}, ~{unique:,} unique blocks of {BLOCK}"
    )
    fracs = [0.02, 0.05, 0.15, 0.4, 0.8, 1.3]
    dev_fixed, host_fixed = int(0.02 * unique), int(0.1 * unique)
    curves: dict[str, list[float]] = {
        "device only": [],
        "host (+2% device)": [],
        "disk (+2% device, 10% host)": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for i, f in enumerate(fracs):
            cap = max(1, int(f * unique))
            curves["device only"].append(replay(trace, (cap, 0, 0), tmp)[0])
            curves["host (+2% device)"].append(replay(trace, (dev_fixed, cap, 0), tmp)[0])
            rate, _ = replay(trace, (dev_fixed, host_fixed, cap), f"{tmp}/d{i}")
            curves["disk (+2% device, 10% host)"].append(rate)
            print(
                f"capacity {f:4.0%} of unique blocks: "
                + ", ".join(f"{k} {v[-1]:.2%}" for k, v in curves.items())
            )
        rate, per_tier = replay(trace, (dev_fixed, host_fixed, int(1.3 * unique)), f"{tmp}/full")
    print(
        f"enough capacity (2% device, 10% host, 130% disk): token hit rate {rate:.2%} "
        f"(upper bound {reusable:.2%}); hit tokens per tier {per_tier}"
    )
    print(f"replay time {time.perf_counter() - t0:.0f} s")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for name, ys in curves.items():
            ax.plot([100 * f for f in fracs], [100 * y for y in ys], marker="o", label=name)
        ax.axhline(100 * reusable, color="grey", ls="--", lw=1, label="reusable tokens")
        ax.set_xlabel("capacity of the swept tier (% of the trace's unique blocks)")
        ax.set_ylabel("token hit rate (%)")
        ax.set_title("Prefix KV hit rate vs tier capacity (synthetic chat/agent trace)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
