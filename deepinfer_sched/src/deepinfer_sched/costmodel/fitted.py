"""A cost model fitted to an engine's measured step times (a profile file).

The profile is JSON written by ``deepinfer bench --profile out.json`` (or any engine that
times its own steps): prefill steps over prompt lengths and decode steps over batch sizes
and total contexts. :func:`fit_profile` fits, by least squares with non-negative terms,

- ``prefill_time(n, c) = p0 + p1 n + p2 n (c + (n + 1) / 2)`` (per-step cost, linear
  layers per token, causal attention per (query, key) pair);
- ``decode_step_time(B, T) = d0 + d1 B + d2 T`` (per-step cost, per sequence, per
  context token read);

and keeps the fit's worst relative error per kind, so a caller can see how far to trust it.
KV transfers and SSD reads use the link and SSD figures given to the fit (the profile of
one engine cannot measure them).

A live profile (``deepinfer serve --profile-out``: every step serving replicas ran, under the
load they ran under) lists ``steps`` instead, most of them mixing prefill chunks with a decode
batch. Those are fitted jointly, the way the simulator charges a mixed iteration (every
chunk's time, the decode terms, the step's fixed cost ``o`` once)::

    step = o + sum_chunks (e + p1 n + p2 n (c + (n + 1) / 2) + k c) + d1 B + d2 T

``e`` is what each prefill chunk costs beyond its tokens (its sequence's setup: block table,
positions, sampling the first token) and ``k`` what each token already in the KV cache costs
the chunk beyond attention (a prefix-cache hit's KV is read back through the paged pool):
without them a live fit charged a lone decode step 1.5x its measured time and a prefill after a
prefix hit 0.8x (the shared ``o`` soaked up the chunks' setup). The model keeps ``o + e`` as
``prefill_coef[0]`` and ``o`` as ``decode_coef[0]``, so ``step_overhead_s`` (the smaller)
is ``o``. The fit is ordinary (not relative) least squares, so the fit follows the mean step time, which is
what sets throughput and queueing; ``fit_error`` then reports the relative RMS error per
step and the relative error of the summed time. :func:`merge_profiles` joins the files of
several replicas.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["PROFILE_FORMAT", "FittedCostModel", "fit_profile", "load_profile", "merge_profiles"]

PROFILE_FORMAT = "deepinfer-step-profile"


@dataclass(frozen=True)
class FittedCostModel:
    """Implements :class:`~deepinfer_sched.costmodel.CostModel` and ``WorkParts`` from
    fitted coefficients (seconds). ``kv_capacity`` is the profiled engine's KV pool in
    tokens; ``kv_memory_fraction`` requests scale it relative to 0.9 (the default)."""

    prefill_coef: tuple[float, float, float]
    decode_coef: tuple[float, float, float]
    kv_bytes_per_token: int
    kv_capacity: int
    link_bandwidth: float = 25e9
    link_latency_s: float = 20e-6
    ssd_bandwidth: float = 5e9
    ssd_latency_s: float = 100e-6
    source: str = ""
    fit_error: dict[str, float] = field(default_factory=dict)
    # Seconds per token already in the KV cache when a prefill chunk runs, beyond attention
    # (reading a prefix hit back through the paged pool); only a live fit sets it. Last, so
    # positional construction and older JSON files (without it) stay valid.
    cached_coef: float = 0.0

    def __post_init__(self) -> None:
        for name in ("prefill_coef", "decode_coef"):
            coef = getattr(self, name)
            if len(coef) != 3 or not all(math.isfinite(v) and v >= 0 for v in coef):
                raise ValueError(f"FittedCostModel.{name} must be 3 finite numbers >= 0")
        if isinstance(self.cached_coef, bool) or not (
            isinstance(self.cached_coef, (int, float))
            and math.isfinite(self.cached_coef)
            and self.cached_coef >= 0
        ):
            raise ValueError(
                f"FittedCostModel.cached_coef must be a finite number >= 0, got {self.cached_coef!r}"
            )
        if self.kv_bytes_per_token < 1 or self.kv_capacity < 1:
            raise ValueError("FittedCostModel.kv_bytes_per_token and kv_capacity must be >= 1")
        for name in ("link_bandwidth", "ssd_bandwidth"):
            if not getattr(self, name) > 0:
                raise ValueError(f"FittedCostModel.{name} must be > 0")
        for name in ("link_latency_s", "ssd_latency_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"FittedCostModel.{name} must be >= 0")

    @property
    def step_overhead_s(self) -> float:
        """The fixed cost every forward pays once (the smaller of the two fitted per-step
        terms): the simulator charges it once for an iteration mixing prefill chunks and a
        decode step."""
        return min(self.prefill_coef[0], self.decode_coef[0])

    def scaled(self, factor: float) -> FittedCostModel:
        """This model with every step time multiplied by ``factor``: a calibration carried to
        a machine running ``factor`` times slower, as a speed probe timed before a run measures
        it against one timed before the calibration. KV transfer and SSD figures stay."""
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"factor must be a number, got {factor!r}")
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be finite and > 0, got {factor}")
        return replace(
            self,
            prefill_coef=(
                factor * self.prefill_coef[0],
                factor * self.prefill_coef[1],
                factor * self.prefill_coef[2],
            ),
            decode_coef=(
                factor * self.decode_coef[0],
                factor * self.decode_coef[1],
                factor * self.decode_coef[2],
            ),
            cached_coef=factor * self.cached_coef,
            source=f"{self.source} x {factor:.4g}",
        )

    # ------------------------------------------------------------------ CostModel
    def prefill_parts(self, new_tokens: int, cached_tokens: int = 0) -> tuple[float, float]:
        """(token-proportional seconds, fixed per-step seconds): the first grows with the
        work, the second is the step's floor (weights read, launch and framework overhead)."""
        if new_tokens <= 0:
            return 0.0, 0.0
        p0, p1, p2 = self.prefill_coef
        n, c = float(new_tokens), float(cached_tokens)
        return p1 * n + p2 * n * (c + (n + 1.0) / 2.0) + self.cached_coef * c, p0

    def decode_parts(self, batch_size: int, total_context_tokens: int) -> tuple[float, float]:
        if batch_size <= 0:
            return 0.0, 0.0
        d0, d1, d2 = self.decode_coef
        return d1 * batch_size + d2 * total_context_tokens, d0

    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        a, b = self.prefill_parts(new_tokens, cached_tokens)
        return a + b

    def decode_step_time(self, batch_size: int, total_context_tokens: int) -> float:
        a, b = self.decode_parts(batch_size, total_context_tokens)
        return a + b

    def kv_transfer_time(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return self.link_latency_s + num_tokens * self.kv_bytes_per_token / self.link_bandwidth

    def ssd_fetch_time(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return self.ssd_latency_s + num_tokens * self.kv_bytes_per_token / self.ssd_bandwidth

    def kv_capacity_tokens(self, memory_fraction: float = 0.9) -> int:
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        return max(1, int(self.kv_capacity * memory_fraction / 0.9))

    # ------------------------------------------------------------------ files
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> FittedCostModel:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("fitted cost model JSON must be an object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown FittedCostModel keys: {unknown}")
        for name in ("prefill_coef", "decode_coef"):
            if name in data:
                data[name] = tuple(float(v) for v in data[name])
        return cls(**data)


def load_profile(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a step profile; errors name the file and the bad entry."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: cannot read a JSON profile ({e})") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise ValueError(f"{p}: not a step profile (expected format {PROFILE_FORMAT!r})")
    if "steps" in data:
        _steps(data["steps"], p)
    else:
        _rows(data, "prefill", ("new_tokens", "cached_tokens"), p)
        _rows(data, "decode", ("batch_size", "context_tokens"), p)
    for key in ("kv_bytes_per_token", "kv_capacity_tokens"):
        v = data.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{p}: {key} must be an integer >= 1, got {v!r}")
    return data


def _rows(data: Mapping[str, Any], kind: str, keys: Sequence[str], path: str) -> None:
    rows = data.get(kind)
    if not isinstance(rows, list) or len(rows) < 3:
        raise ValueError(f"{path}: {kind} must list at least 3 measured steps")
    for i, row in enumerate(rows):
        ok = isinstance(row, dict) and all(
            isinstance(row.get(k), int) and not isinstance(row.get(k), bool) and row[k] >= 0
            for k in keys
        )
        secs = row.get("seconds") if isinstance(row, dict) else None
        if not isinstance(secs, list) or not secs:
            ok = False
        else:
            ok = ok and all(
                isinstance(s, (int, float)) and math.isfinite(s) and s > 0 for s in secs
            )
        if not ok:
            raise ValueError(
                f"{path}: {kind}[{i}] must have integer {', '.join(keys)} >= 0 and a non-empty "
                f"list of positive 'seconds', got {row!r:.120}"
            )


def _steps(steps: Any, path: str) -> None:
    if not isinstance(steps, list) or len(steps) < 3:
        raise ValueError(f"{path}: steps must list at least 3 measured steps")

    def count(v: Any, least: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= least

    for i, row in enumerate(steps):
        ok = isinstance(row, dict)
        if ok:
            chunks = row.get("prefill")
            secs = row.get("seconds")
            ok = (
                isinstance(chunks, list)
                and all(
                    isinstance(c, list) and len(c) == 2 and count(c[0], 1) and count(c[1], 0)
                    for c in chunks
                )
                and count(row.get("batch_size"), 0)
                and count(row.get("context_tokens"), 0)
                and (bool(chunks) or row["batch_size"] > 0)
                and isinstance(secs, (int, float))
                and not isinstance(secs, bool)
                and math.isfinite(secs)
                and secs > 0
            )
        if not ok:
            raise ValueError(
                f"{path}: steps[{i}] must have 'prefill' (a list of [new_tokens >= 1, "
                "cached_tokens >= 0]), integer batch_size and context_tokens >= 0 (some work "
                f"in all) and positive 'seconds', got {row!r:.120}"
            )


def merge_profiles(profiles: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One live profile holding the ``steps`` of several (the replicas of one server, or
    several runs on the same engine); they must describe the same KV layout."""
    if not profiles:
        raise ValueError("merge_profiles: no profiles given")
    first = profiles[0]
    steps: list[Any] = []
    for i, prof in enumerate(profiles):
        if "steps" not in prof:
            raise ValueError(f"profiles[{i}] has no 'steps' (only live profiles merge)")
        for key in ("kv_bytes_per_token", "kv_capacity_tokens"):
            if prof.get(key) != first.get(key):
                raise ValueError(
                    f"profiles[{i}].{key} = {prof.get(key)!r} differs from profiles[0]'s "
                    f"{first.get(key)!r}: not the same engine"
                )
        steps.extend(prof["steps"])
    return {**first, "steps": steps}


def _fit_steps(steps: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, dict[str, float]]:
    """Joint least squares of live steps: ``[o, p1, p2, d1, d2, e, k]`` (module doc) and
    the fit's errors."""
    rows = []
    for r in steps:
        n_sum = attn = cached = 0.0
        for n, c in r["prefill"]:
            n_sum += n
            attn += n * (c + (n + 1.0) / 2.0)
            cached += c
        rows.append(
            (
                1.0,
                n_sum,
                attn,
                float(r["batch_size"]),
                float(r["context_tokens"]),
                float(len(r["prefill"])),
                cached,
            )
        )
    a = np.array(rows, dtype=np.float64)
    y = np.array([float(r["seconds"]) for r in steps])
    # Columns span 1..1e7: scale each to unit size so the solver sees a sane problem.
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
    coef = _nnls(a / scale, y) / scale
    pred = a @ coef
    err = {
        "steps": float(len(y)),
        "steps_rel_rms": float(np.sqrt(np.mean(((pred - y) / y) ** 2))),
        "steps_total_rel": float(abs(pred.sum() - y.sum()) / y.sum()),
    }
    return coef, err


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients for a handful of columns: try every
    subset of active columns, keep the best feasible fit (exact for 3 columns)."""
    best: tuple[float, np.ndarray] | None = None
    k = a.shape[1]
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(k)
        full[cols] = coef
        err = float(np.sum((a @ full - y) ** 2))
        if best is None or err < best[0]:
            best = (err, full)
    assert best is not None
    return best[1]


def fit_profile(
    profile: Mapping[str, Any],
    *,
    link_bandwidth: float = 25e9,
    link_latency_s: float = 20e-6,
    ssd_bandwidth: float = 5e9,
    ssd_latency_s: float = 100e-6,
) -> FittedCostModel:
    """Fit :class:`FittedCostModel` to a profile (see :func:`load_profile`). Each row's
    median time is fitted with relative weights (every row counts alike whether it takes
    1 ms or 1 s); ``fit_error`` holds the worst relative error per kind. A live profile
    (``steps``) is fitted jointly instead (module doc)."""
    if "steps" in profile:
        coef, err = _fit_steps(profile["steps"])
        o, p1, p2, d1, d2, e, k = (float(v) for v in coef)
        return FittedCostModel(
            (o + e, p1, p2),
            (o, d1, d2),
            int(profile["kv_bytes_per_token"]),
            int(profile["kv_capacity_tokens"]),
            link_bandwidth,
            link_latency_s,
            ssd_bandwidth,
            ssd_latency_s,
            str(profile.get("engine", {}).get("model", "")) + " (live steps)",
            err,
            cached_coef=k,
        )
    pre = profile["prefill"]
    n = np.array([r["new_tokens"] for r in pre], dtype=np.float64)
    c = np.array([r["cached_tokens"] for r in pre], dtype=np.float64)
    yp = np.array([float(np.median(r["seconds"])) for r in pre])
    ap = np.stack([np.ones_like(n), n, n * (c + (n + 1.0) / 2.0)], axis=1)
    pc = _nnls(ap / yp[:, None], np.ones_like(yp))
    dec = profile["decode"]
    b = np.array([r["batch_size"] for r in dec], dtype=np.float64)
    t = np.array([r["context_tokens"] for r in dec], dtype=np.float64)
    yd = np.array([float(np.median(r["seconds"])) for r in dec])
    ad = np.stack([np.ones_like(b), b, t], axis=1)
    dc = _nnls(ad / yd[:, None], np.ones_like(yd))
    err = {
        "prefill_max_rel": float(np.max(np.abs(ap @ pc - yp) / yp)),
        "decode_max_rel": float(np.max(np.abs(ad @ dc - yd) / yd)),
    }
    return FittedCostModel(
        (float(pc[0]), float(pc[1]), float(pc[2])),
        (float(dc[0]), float(dc[1]), float(dc[2])),
        int(profile["kv_bytes_per_token"]),
        int(profile["kv_capacity_tokens"]),
        link_bandwidth,
        link_latency_s,
        ssd_bandwidth,
        ssd_latency_s,
        str(profile.get("engine", {}).get("model", "")),
        err,
    )
