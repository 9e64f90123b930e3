"""Step-time profile of an engine: prefill and decode steps over sizes, written as JSON.

``deepinfer bench --profile out.json`` writes it; ``deepinfer-sched calibrate --profile
out.json`` fits the simulator's cost model to it, so the simulator predicts this engine on
this machine. Format (``format = "deepinfer-step-profile"``, ``version = 1``)::

    {"format": ..., "version": 1,
     "engine": {"model": ..., "device": ..., "dtype": ..., "block_size": 16,
                "max_num_seqs": 32, "max_batched_tokens": 2048},
     "kv_bytes_per_token": 46080, "kv_capacity_tokens": 32768,
     "prefill": [{"new_tokens": 256, "cached_tokens": 0, "seconds": [0.051, 0.049]}, ...],
     "decode":  [{"batch_size": 4, "context_tokens": 1040, "seconds": [0.012, ...]}, ...]}

A prefill row times one engine step that prefills one prompt of ``new_tokens`` tokens
(nothing else running); a decode row times one step in which ``batch_size`` sequences
holding ``context_tokens`` KV tokens in all each decode one token. Prompts are random
token ids, distinct per request, so no prefix-cache hit shortens a step.

A live profile (`StepRecorder`, written by ``deepinfer serve --profile-out``) has the same
header and a ``steps`` list instead: every step a serving replica ran, as it ran it, next to
whatever else shared the machine (the other replicas, the HTTP front, the clients)::

    "steps": [{"prefill": [[new_tokens, cached_tokens], ...], "batch_size": 3,
               "context_tokens": 1210, "seconds": 0.041}, ...]

``prefill`` lists the step's prefill chunks (``cached_tokens``: KV already held before the
chunk), ``batch_size`` / ``context_tokens`` its decoding sequences and the KV they hold after
the step, ``seconds`` the replica's whole loop iteration (messages in, state out, the forward, the
outputs sent, and whatever time the OS gave other processes meanwhile),
which is what one simulator iteration stands for. ``requests`` lists, per finished request,
``[queued, first_token, finished, prompt_tokens, cached_tokens]`` (``queued``: when the front
handed the request to this replica's pipe) on the
``time.perf_counter()`` clock (system-wide monotonic on Linux, so a client on the same machine
can subtract its own send time: what the HTTP front and the pipes add to TTFT).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from deepinfer.engine import SamplingParams
from deepinfer.engine.chunk import Chunk
from deepinfer.engine.engine import LLMEngine

__all__ = ["PROFILE_FORMAT", "StepRecorder", "profile_engine", "write_profile"]

PROFILE_FORMAT = "deepinfer-step-profile"


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
    profile dict (see the module doc). Sizes the engine cannot hold at once are skipped."""
    if engine.has_unfinished():
        raise ValueError("engine: profile an idle engine (it has unfinished requests)")
    if decode_steps < 1 or repeats < 1:
        raise ValueError("decode_steps and repeats must be >= 1")
    cfg = engine.config
    vocab = engine.model.config.vocab_size
    rng = random.Random(seed)
    cap_tokens = engine.capacity_blocks * cfg.block_size
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    # A namespace of its own: the prompts are seeded, so without it a persistent prefix cache
    # serves an earlier profile's prompts as hits and the "prefill" rows time cache reads.
    ns = os.urandom(16)
    # Warm-up: the first steps pay one-off costs (allocation, kernel build).
    for n in (32, 32):
        engine.add_request(_prompt(rng, n, vocab), one, namespace=ns)
        _timed_steps(engine)
    prefill = []
    for n in prefill_lens:
        if n > cfg.max_batched_tokens or n + 1 > cap_tokens or n >= engine.max_model_len:
            continue
        secs = []
        for _ in range(repeats):
            engine.add_request(_prompt(rng, n, vocab), one, namespace=ns)
            steps = _timed_steps(engine)
            secs.append(round(steps[0][0], 6))
        prefill.append({"new_tokens": n, "cached_tokens": 0, "seconds": secs})
    decode = []
    for b in batch_sizes:
        for ctx in context_lens:
            need = b * (ctx + decode_steps + 2 + cfg.block_size)
            if (
                b > cfg.max_num_seqs
                or need > cap_tokens
                or ctx + decode_steps + 2 >= (engine.max_model_len)
            ):
                continue
            params = SamplingParams(temperature=0.0, max_tokens=decode_steps + 2, ignore_eos=True)
            for _ in range(b):
                engine.add_request(_prompt(rng, ctx, vocab), params, namespace=ns)
            secs = []
            generated = 0
            while engine.has_unfinished():
                running = engine.running
                pure = (
                    len(running) == b
                    and not engine.waiting
                    and all(s.num_computed == s.num_tokens - 1 for s in running)
                )
                t0 = time.perf_counter()
                engine.step()
                dt = time.perf_counter() - t0
                if pure and generated >= 1 and len(secs) < decode_steps:
                    secs.append(round(dt, 6))
                if pure:
                    generated += 1
            if secs:
                total = b * (ctx + 2 + len(secs) // 2)
                decode.append({"batch_size": b, "context_tokens": total, "seconds": secs})
    return {**_header(engine, model_name), "prefill": prefill, "decode": decode}


def _header(engine: LLMEngine, model_name: str) -> dict[str, Any]:
    cfg = engine.config
    param = next(engine.model.parameters())
    return {
        "format": PROFILE_FORMAT,
        "version": 1,
        "engine": {
            "model": model_name,
            "device": str(param.device),
            "dtype": str(param.dtype).replace("torch.", ""),
            "block_size": cfg.block_size,
            "max_num_seqs": cfg.max_num_seqs,
            "max_batched_tokens": cfg.max_batched_tokens,
            "chunked_prefill": cfg.chunked_prefill,
        },
        "kv_bytes_per_token": int(engine.pool.bytes_per_block // cfg.block_size),
        "kv_capacity_tokens": int(engine.capacity_blocks * cfg.block_size),
    }


class StepRecorder:
    """The steps a live engine ran: batch composition -> iteration seconds, in a bounded
    buffer (the oldest steps drop out past ``max_steps``, so a long-running server keeps a
    fixed few MB). Recording a step costs a pass over its chunks, no copy of any tensor."""

    def __init__(self, max_steps: int = 200_000) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self._steps: deque[dict[str, Any]] = deque(maxlen=max_steps)
        self._requests: deque[list[float | int]] = deque(maxlen=max_steps)

    def __len__(self) -> int:
        return len(self._steps)

    def record(self, chunks: Sequence[Chunk], seconds: float) -> None:
        """One step that ran ``chunks`` in ``seconds`` (call right after the step: a chunk
        is a prefill chunk while it is below its sequence's prefill target)."""
        if not chunks or not seconds > 0:
            return
        prefill: list[list[int]] = []
        batch = context = 0
        for c in chunks:
            if c.start < c.seq.prefill_target:
                prefill.append([c.length, c.start])
            else:
                batch += 1
                context += c.end
        self._steps.append(
            {
                "prefill": prefill,
                "batch_size": batch,
                "context_tokens": context,
                "seconds": round(seconds, 7),
            }
        )

    def request(
        self, received: float, first_token: float, finished: float, prompt: int, cached: int
    ) -> None:
        """One finished request's replica-side times (``time.perf_counter()``)."""
        self._requests.append(
            [round(received, 6), round(first_token, 6), round(finished, 6), prompt, cached]
        )

    def profile(self, engine: LLMEngine, model_name: str = "") -> dict[str, Any]:
        """The live profile (module doc) of the steps recorded so far on ``engine``."""
        return {
            **_header(engine, model_name),
            "steps": list(self._steps),
            "requests": list(self._requests),
        }


def write_profile(profile: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``profile`` as JSON (creating the parent directory); the file appears whole or
    not at all (written aside, then renamed)."""
    p = os.fspath(path)
    parent = os.path.dirname(p)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = f"{p}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(profile, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")
    os.replace(tmp, p)
