"""The engine's side of step profiles: time an idle engine, or record a live one's steps.

``deepinfer bench --profile out.json`` writes :func:`profile_engine`'s offline profile;
``deepinfer serve --profile-out`` writes each replica's :class:`StepRecorder`.
``deepinfer-sched calibrate --profile`` fits the simulator's cost model to either, so the
simulator predicts this engine on this machine. The file format, its writer and the bounded
step log are ``deepinfer_sched.costmodel``'s (``step_log``); this module only turns engine
steps into its rows, and which steps an offline profile times is its ``ProfileGrid``.

In an offline profile, prompts are random token ids, distinct per request and under a
namespace of the run's own, so no prefix-cache hit shortens a step.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from typing import Any

from deepinfer.engine import SamplingParams
from deepinfer.engine.chunk import Chunk
from deepinfer.engine.engine import LLMEngine
from deepinfer_sched.costmodel import (
    PROFILE_FORMAT,
    EngineLimits,
    ProfileGrid,
    StepLog,
    profile_header,
    write_profile,
)

# The format constant and the writer are re-exported: callers of this module use them.
__all__ = ["PROFILE_FORMAT", "StepRecorder", "profile_engine", "write_profile"]


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def _timed_steps(engine: LLMEngine) -> list[tuple[float, int]]:
    """Run the engine dry: (seconds, number of outputs) per step."""
    out = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        res = engine.step()
        out.append((time.perf_counter() - t0, len(res)))
    return out


def profile_engine(
    engine: LLMEngine,
    *,
    prefill_lens: Sequence[int] = (16, 64, 128, 256, 512, 1024),
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
    context_lens: Sequence[int] = (64, 256, 1024),
    decode_steps: int = 4,
    repeats: int = 3,
    seed: int = 0,
    model_name: str = "",
) -> dict[str, Any]:
    """Time prefill and decode steps of ``engine`` (which must be idle) and return the
    profile dict (see the module doc). The sizes are a
    :class:`~deepinfer_sched.costmodel.ProfileGrid`'s; those the engine cannot hold at once
    are skipped."""
    if engine.has_unfinished():
        raise ValueError("engine: profile an idle engine (it has unfinished requests)")
    grid = ProfileGrid(prefill_lens, batch_sizes, context_lens, decode_steps, repeats)
    cfg = engine.config
    limits = EngineLimits(
        max_batched_tokens=cfg.max_batched_tokens,
        max_num_seqs=cfg.max_num_seqs,
        capacity_tokens=engine.capacity_blocks * cfg.block_size,
        max_model_len=engine.max_model_len,
        block_size=cfg.block_size,
    )
    vocab = engine.model.config.vocab_size
    rng = random.Random(seed)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    # A namespace of its own: the prompts are seeded, so without it a persistent prefix cache
    # serves an earlier profile's prompts as hits and the "prefill" rows time cache reads.
    ns = os.urandom(16)
    # Warm-up: the first steps pay one-off costs (allocation, kernel build).
    for n in (32, 32):
        engine.add_request(_prompt(rng, n, vocab), one, namespace=ns)
        _timed_steps(engine)

    def time_prefill(n: int) -> float:
        engine.add_request(_prompt(rng, n, vocab), one, namespace=ns)
        return _timed_steps(engine)[0][0]

    params = SamplingParams(temperature=0.0, max_tokens=grid.decode_tokens, ignore_eos=True)

    def time_decode(b: int, ctx: int) -> list[float]:
        """The steps where all ``b`` sequences decode together, past the first of them."""
        for _ in range(b):
            engine.add_request(_prompt(rng, ctx, vocab), params, namespace=ns)
        secs, pure_steps = [], 0
        while engine.has_unfinished():
            running = engine.running
            pure = (
                len(running) == b
                and not engine.waiting
                and all(s.num_computed == s.num_tokens - 1 for s in running)
            )
            t0 = time.perf_counter()
            engine.step()
            if pure and pure_steps >= 1:
                secs.append(time.perf_counter() - t0)
            pure_steps += pure
        return secs

    return {**_header(engine, model_name), **grid.run(limits, time_prefill, time_decode)}


def _header(engine: LLMEngine, model_name: str) -> dict[str, Any]:
    cfg = engine.config
    param = next(engine.model.parameters())
    described = {
        "model": model_name,
        "device": str(param.device),
        "dtype": str(param.dtype).replace("torch.", ""),
        "block_size": cfg.block_size,
        "max_num_seqs": cfg.max_num_seqs,
        "max_batched_tokens": cfg.max_batched_tokens,
        "chunked_prefill": cfg.chunked_prefill,
    }
    return profile_header(
        described,
        kv_bytes_per_token=int(engine.pool.bytes_per_block // cfg.block_size),
        kv_capacity_tokens=int(engine.capacity_blocks * cfg.block_size),
    )


class StepRecorder(StepLog):
    """A live engine's :class:`~deepinfer_sched.costmodel.StepLog`, fed with the chunks each
    step ran. Recording a step costs a pass over its chunks, no copy of any tensor."""

    def record(self, chunks: Sequence[Chunk], seconds: float) -> None:
        """One step that ran ``chunks`` in ``seconds`` (call right after the step: a chunk
        is a prefill chunk while it is below its sequence's prefill target)."""
        prefill = [(c.length, c.start) for c in chunks if c.start < c.seq.prefill_target]
        decode = [c.end for c in chunks if c.start >= c.seq.prefill_target]
        self.add_step(prefill, len(decode), sum(decode), seconds)

    def profile(self, engine: LLMEngine, model_name: str = "") -> dict[str, Any]:
        """The live profile of the steps recorded so far on ``engine``."""
        return self.live_profile(_header(engine, model_name))
