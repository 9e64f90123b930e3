"""GPU check section: sampling (#23 item 3).

The rejection sampling kernel (``dk.sample`` on CUDA) against the bisection kernel it replaced
(``benchmarks/_sampling_bisection_kernel.py``) and the torch path (sort / top-k based) on the
same logits, Llama-3 vocabulary (128256), fp32 logits, batch 1-256; per setting the median
time per call, the speed-up over bisection, the mean rejection rounds, and the achieved
bandwidth of the rejection kernel (logits bytes x passes / time). GPU-only work happens
inside ``run()``; importing this module is cheap and safe on CPU.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

VOCAB = 128256
BATCHES = (1, 32, 256)
SETTINGS = {  # name: (temperature, top_k, top_p, min_p)
    "plain": (1.0, 0, 1.0, 0.0),
    "top-p 0.9": (0.8, 0, 0.9, 0.0),
    "top-k 50 + top-p 0.9": (0.8, 50, 0.9, 0.0),
}
TIME_BUDGET_S = 60.0


def _bench(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def _row(batch: int, name: str) -> str:
    import torch

    import deepinfer_kernels as dk
    from deepinfer_kernels.sampling.triton_sampling import sample_triton

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from _sampling_bisection_kernel import sample_bisection

    t, k, p, m = SETTINGS[name]
    g = torch.Generator(device="cuda").manual_seed(batch)
    logits = 2.5 * torch.randn(batch, VOCAB, device="cuda", generator=g)
    params = [torch.full((batch,), v, device="cuda") for v in (t, k, p, m)]
    params[1] = params[1].long()
    u = torch.rand(batch, device="cuda", generator=g)
    seed = torch.tensor([5], dtype=torch.int64, device="cuda")
    rounds = torch.zeros(batch, dtype=torch.int32, device="cuda")
    t_new = _bench(lambda: sample_triton(logits, *params, u, seed, rounds))
    t_old = _bench(lambda: sample_bisection(logits, *params, u))
    t_torch = _bench(lambda: dk.sample(logits, *params, use_triton=False, check_values=False))
    mean_rounds = float(rounds.float().mean())
    filtered = k > 0 or p < 1.0 or m > 0
    passes = 1 + (2 if filtered else 1) * mean_rounds
    gbps = batch * VOCAB * 4 * passes / t_new / 1e9
    return (
        f"| {batch} | {name} | {t_new * 1e6:.0f} | {t_old * 1e6:.0f} | {t_old / t_new:.1f}x | "
        f"{t_torch * 1e6:.0f} | {mean_rounds:.2f} | {gbps:.0f} |"
    )


def run() -> str:
    import torch

    if not torch.cuda.is_available():
        return "## Sampling\n\nskipped: no CUDA device\n"
    deadline = time.perf_counter() + TIME_BUDGET_S
    rows = []
    for batch in BATCHES:
        for name in SETTINGS:
            if time.perf_counter() > deadline:
                rows.append(f"| {batch} | {name} | skipped: time budget | | | | | |")
                continue
            rows.append(_row(batch, name))
    table = "\n".join(
        [
            "| batch | setting | rejection us | bisection us | speed-up | torch path us | "
            "mean rounds | rejection GB/s |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    return (
        "## Sampling\n\n"
        f"Vocabulary {VOCAB}, fp32 logits (2.5 x standard normal); rejection = today's "
        "kernel, bisection = the kernel it replaced, torch path = sort/top-k based.\n\n"
        f"{table}\n"
    )
