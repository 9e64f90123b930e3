"""Writing step profiles: the file format :func:`load_profile` reads, and a live step log.

An engine times its own steps and writes them here; ``deepinfer-sched calibrate --profile``
fits the simulator's cost model to the file (:func:`fit_profile`), so the simulator predicts
that engine on that machine. Format (``format = "deepinfer-step-profile"``, ``version = 1``)::

    {"format": ..., "version": 1,
     "engine": {"model": ..., "device": ..., "dtype": ..., "block_size": 16,
                "max_num_seqs": 32, "max_batched_tokens": 2048},
     "kv_bytes_per_token": 46080, "kv_capacity_tokens": 32768,
     "prefill": [{"new_tokens": 256, "cached_tokens": 0, "seconds": [0.051, 0.049]}, ...],
     "decode":  [{"batch_size": 4, "context_tokens": 1040, "seconds": [0.012, ...]}, ...]}

A prefill row times one engine step that prefills one prompt of ``new_tokens`` tokens
(nothing else running); a decode row times one step in which ``batch_size`` sequences
holding ``context_tokens`` KV tokens in all each decode one token (``deepinfer bench
--profile`` writes such an offline profile).

A live profile (a :class:`StepLog`, written by ``deepinfer serve --profile-out``) has the same
header and a ``steps`` list instead: every step a serving replica ran, as it ran it, next to
whatever else shared the machine (the other replicas, the HTTP front, the clients)::

    "steps": [{"prefill": [[new_tokens, cached_tokens], ...], "batch_size": 3,
               "context_tokens": 1210, "seconds": 0.041}, ...]

``prefill`` lists the step's prefill chunks (``cached_tokens``: KV already held before the
chunk), ``batch_size`` / ``context_tokens`` its decoding sequences and the KV they hold after
the step, ``seconds`` the replica's whole loop iteration (messages in, state out, the forward,
the outputs sent, and whatever time the OS gave other processes meanwhile), which is what one
simulator iteration stands for. ``requests`` lists, per finished request, ``[queued,
first_token, finished, prompt_tokens, cached_tokens]`` (``queued``: when the front handed the
request to the replica) on the ``time.perf_counter()`` clock (system-wide monotonic on Linux,
so a client on the same machine can subtract its own send time: what the front adds to TTFT).

Example::

    from deepinfer_sched.costmodel import StepLog, profile_header, write_profile

    log = StepLog()
    log.add_step([(128, 0)], batch_size=3, context_tokens=1210, seconds=0.041)
    header = profile_header({"model": "m"}, kv_bytes_per_token=46080, kv_capacity_tokens=32768)
    write_profile(log.live_profile(header), "replica-0.json")
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from deepinfer_sched.costmodel.fitted import PROFILE_FORMAT

__all__ = ["PROFILE_VERSION", "StepLog", "profile_header", "write_profile"]

PROFILE_VERSION = 1


def profile_header(
    engine: Mapping[str, Any], kv_bytes_per_token: int, kv_capacity_tokens: int
) -> dict[str, Any]:
    """The fields every profile starts with; ``engine`` describes the profiled engine (model,
    device, dtype, batch limits: kept for the reader, not fitted)."""
    for name, value in (
        ("kv_bytes_per_token", kv_bytes_per_token),
        ("kv_capacity_tokens", kv_capacity_tokens),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "engine": dict(engine),
        "kv_bytes_per_token": kv_bytes_per_token,
        "kv_capacity_tokens": kv_capacity_tokens,
    }


class StepLog:
    """The steps a live engine ran, batch composition -> iteration seconds, in a bounded buffer
    (the oldest steps drop out past ``max_steps``, so a long-running server keeps a fixed few
    MB), and its finished requests' times."""

    def __init__(self, max_steps: int = 200_000) -> None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        self._steps: deque[dict[str, Any]] = deque(maxlen=max_steps)
        self._requests: deque[list[float | int]] = deque(maxlen=max_steps)

    def __len__(self) -> int:
        return len(self._steps)

    def add_step(
        self,
        prefill: Sequence[tuple[int, int]],
        batch_size: int,
        context_tokens: int,
        seconds: float,
    ) -> None:
        """One step: its prefill chunks as ``(new_tokens, cached_tokens)``, its decode batch
        and the KV that batch holds. A step with no work or no measurable time is not kept
        (:func:`load_profile` would refuse it)."""
        if (not prefill and batch_size <= 0) or not (math.isfinite(seconds) and seconds > 0):
            return
        self._steps.append(
            {
                "prefill": [[int(n), int(c)] for n, c in prefill],
                "batch_size": int(batch_size),
                "context_tokens": int(context_tokens),
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

    def live_profile(self, header: Mapping[str, Any]) -> dict[str, Any]:
        """The live profile (module doc): ``header`` (:func:`profile_header`) plus the steps
        and requests logged so far."""
        return {**header, "steps": list(self._steps), "requests": list(self._requests)}


def write_profile(profile: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``profile`` as JSON (creating the parent directory); the file appears whole or
    not at all (written aside, then renamed)."""
    p = os.fspath(path)
    parent = os.path.dirname(p)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = f"{p}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(profile, f, indent=1, sort_keys=True, allow_nan=False)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        # A value JSON cannot hold (NaN, a tensor) must not leave a half-written file behind.
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
