"""Timing an idle engine's steps for an offline profile, over any :class:`SteppableEngine`.

The profiler adds requests, steps the engine until it is idle and times the steps a
:class:`ProfileGrid` asks for: one prefill step per prompt length, and the decode steps in
which a whole batch of sequences decodes together. It knows nothing of tensors or of one
engine's classes: an engine takes part through the small Protocol below
(``deepinfer.profile`` adapts ``LLMEngine`` to it). Example with a toy engine::

    from deepinfer_sched.costmodel import ProfileGrid, profile_engine

    rows = profile_engine(my_engine, ProfileGrid(prefill_lens=(16, 64), batch_sizes=(1, 4)))
    rows["prefill"], rows["decode"]   # the rows fit_profile reads

Prompts are random token ids from a seeded generator; the engine is asked to keep them under
a namespace of their own (``add_request``'s ``namespace``), so no prefix-cache hit of an
earlier profile shortens a step.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from deepinfer_sched.costmodel.profile_grid import EngineLimits, ProfileGrid

# Warm-up prompts run before timing: the first steps pay one-off costs (allocation, a
# kernel's build) that no later step of the same shape pays.
_WARMUP_PROMPTS = (32, 32)
# Token ids below this are left out of random prompts (BOS/EOS/padding in most vocabularies).
_FIRST_TOKEN_ID = 3


class SteppableEngine(Protocol):
    """What the profiler needs of an engine: its limits, requests in, steps, and an abort."""

    @property
    def limits(self) -> EngineLimits: ...

    @property
    def vocab_size(self) -> int: ...

    def add_request(self, prompt_ids: list[int], max_tokens: int, namespace: bytes) -> None:
        """Queue a greedy request that generates exactly ``max_tokens`` tokens (no EOS stop)."""

    def has_unfinished(self) -> bool: ...

    def step(self) -> None:
        """Run one scheduling iteration (one forward)."""

    def decoding_together(self, batch_size: int) -> bool:
        """Whether the next step is a pure decode step of ``batch_size`` sequences: that many
        running, none waiting, each with only its last token left to compute."""

    def abort_all(self) -> None:
        """Drop every unfinished request, freeing its KV."""


def profile_engine(
    engine: SteppableEngine,
    grid: ProfileGrid | None = None,
    *,
    seed: int = 0,
    header: Mapping[str, Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Time ``engine``'s steps over ``grid`` (default: :class:`ProfileGrid`'s sizes; those
    the engine's limits cannot hold are skipped) and return ``header`` (a
    :func:`profile_header`) plus the profile's ``prefill`` and ``decode`` rows.

    ``engine`` must be idle (``ValueError`` otherwise). If a step raises, the requests the
    profiler added are aborted before the error propagates, so the engine is left idle."""
    if engine.has_unfinished():
        raise ValueError("engine: profile an idle engine (it has unfinished requests)")
    grid = grid if grid is not None else ProfileGrid()
    vocab = engine.vocab_size
    if vocab <= _FIRST_TOKEN_ID:
        raise ValueError(f"engine: vocab_size must be > {_FIRST_TOKEN_ID}, got {vocab}")
    rng = random.Random(seed)
    namespace = os.urandom(16)

    def add(n: int, max_tokens: int) -> None:
        prompt = [rng.randrange(_FIRST_TOKEN_ID, vocab) for _ in range(n)]
        engine.add_request(prompt, max_tokens, namespace)

    def step_times() -> list[float]:
        """Run the engine dry: the seconds of each step."""
        out = []
        while engine.has_unfinished():
            t0 = clock()
            engine.step()
            out.append(clock() - t0)
        return out

    def time_prefill(n: int) -> float:
        add(n, 1)
        return step_times()[0]

    def time_decode(b: int, ctx: int) -> list[float]:
        """The steps where all ``b`` sequences decode together, past the first of them (its
        batch may still carry a sequence's first decode after a slower prefill)."""
        for _ in range(b):
            add(ctx, grid.decode_tokens)
        secs, pure_steps = [], 0
        while engine.has_unfinished():
            pure = engine.decoding_together(b)
            t0 = clock()
            engine.step()
            if pure and pure_steps >= 1:
                secs.append(clock() - t0)
            pure_steps += pure
        return secs

    try:
        for n in _WARMUP_PROMPTS:
            add(n, 1)
            step_times()
        rows = grid.run(engine.limits, time_prefill, time_decode)
    except BaseException:
        engine.abort_all()
        raise
    return {**(header or {}), **rows}
