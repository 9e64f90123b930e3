"""What a proposal costs on this machine, and which product makes it cheapest.

The draft gate prices a drafting step by the drafter's measured forward (:func:`time_draft`),
and a caller with several :class:`~deepinfer_spec.linear.LinearFn` (an engine's packed
products, the modules' own) keeps the one under which proposing is fastest here
(:func:`fastest_linear`). Both time a greedy :func:`~deepinfer_spec.propose.propose` for one row
over a full window of context keys and values, the form a continuous batch drafts from.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.linear import LinearFn
from deepinfer_spec.propose import propose
from deepinfer_spec.scheduling import DraftGate, SPSCurve, VerifyScheduler, draft_bound


@torch.no_grad()
def time_draft(drafter: DSparkDrafter, repeats: int = 3, num_tokens: int | None = None) -> float:
    """Median seconds of one greedy proposal for one row over a full context window (what a
    drafting decode step adds for the drafter itself); ``num_tokens`` draws only that many
    positions (``None``: all ``gamma``)."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: expected a positive int, got {repeats!r}")
    weight = drafter.context_proj.weight
    window = drafter.config.window
    context = torch.zeros(
        1, window, drafter.context_kv_dim, dtype=weight.dtype, device=weight.device
    )
    valid = torch.ones(1, window, dtype=torch.bool, device=weight.device)
    anchor = torch.zeros(1, dtype=torch.int64, device=weight.device)
    sync = torch.cuda.synchronize if weight.device.type == "cuda" else None
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        if sync is not None:
            sync()
        start = time.perf_counter()
        propose(
            drafter,
            anchor,
            context,
            valid,
            temperature=0.0,
            context_is_kv=True,
            num_tokens=num_tokens,
        )
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


@torch.no_grad()
def fastest_linear(
    drafter: DSparkDrafter, candidates: Sequence[LinearFn], repeats: int = 5
) -> LinearFn:
    """The candidate under which one greedy proposal (:func:`time_draft`) is fastest on this
    machine; the drafter's own product is left as it was.

    Candidates are timed alternately, ``repeats`` rounds, and compared by their fastest round:
    a preempted round on a shared CPU only ever adds time. Why measure instead of assuming:
    the bf16-panel product was 1.5x faster than MKL for one-row products on the machine it was
    tuned on, and 4-15x slower for the drafter's 5-row products on a loaded 2-core box
    (``benchmarks/results/engine_spec.md``, session 11: an AVX2 code-generation fault, fixed
    in session 13, after which it was 2x faster). Five rounds, not three: under a load of ~10
    on 2 cores, three rounds once kept the product that was 2x slower.
    """
    if not candidates:
        raise ValueError("candidates: expected at least one LinearFn")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: expected a positive int, got {repeats!r}")
    previous, native = drafter.linear, drafter.native
    best: list[float] = [float("inf")] * len(candidates)
    # The products serve the modules' path: time that one, not a compiled block's.
    drafter.use_native(None)
    try:
        for _ in range(repeats):
            for i, fn in enumerate(candidates):
                drafter.use_linear(fn)
                best[i] = min(best[i], time_draft(drafter, repeats=1))
    finally:
        drafter.use_linear(previous)
        drafter.use_native(native)
    return candidates[min(range(len(candidates)), key=best.__getitem__)]


def priced_gate(drafter: DSparkDrafter, scheduler: VerifyScheduler, curve: SPSCurve) -> DraftGate:
    """:meth:`DraftGate.break_even` priced on this machine: the proposal a lone row really
    draws (:func:`time_draft` over the scheduler's bound) against the target's 1-token step and
    what reading a second token adds, from ``curve`` (steps per second at batch 1 and 2)."""
    plain = 1.0 / curve.at(1)
    drawn = max(1, draft_bound(scheduler, 1, drafter.config.gamma))
    return DraftGate.break_even(
        time_draft(drafter, num_tokens=drawn),
        plain,
        verify_extra_s=max(0.0, 1.0 / curve.at(2) - plain),
    )
