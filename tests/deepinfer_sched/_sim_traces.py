"""Small hand-made traces for simulator tests: a few shared system prompts, short tails."""

from __future__ import annotations

import numpy as np

from deepinfer_sched.traces import Trace, TraceRequest


def small_trace(
    n: int,
    rate: float,
    seed: int = 0,
    block_size: int = 16,
    max_prompt: int = 600,
    max_output: int = 60,
    tenants: int = 2,
    priorities: int = 1,
) -> Trace:
    """``n`` requests at Poisson ``rate``; prompts share one of 3 system prefixes."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    reqs = []
    next_id = 10_000
    for i in range(n):
        length = int(rng.integers(1, max_prompt + 1))
        full = length // block_size
        sys_blocks = min(full, int(rng.integers(0, 8)))
        prefix = int(rng.integers(0, 3))
        hashes = [prefix * 1000 + k for k in range(sys_blocks)]
        for _ in range(full - sys_blocks):
            hashes.append(next_id)
            next_id += 1
        reqs.append(
            TraceRequest(
                request_id=i,
                arrival_s=float(t[i]),
                input_len=length,
                output_len=int(rng.integers(1, max_output + 1)),
                block_hashes=tuple(hashes),
                tenant=f"t{int(rng.integers(0, tenants))}",
                priority=int(rng.integers(0, priorities)),
            )
        )
    return Trace(tuple(reqs), block_size, "small")
