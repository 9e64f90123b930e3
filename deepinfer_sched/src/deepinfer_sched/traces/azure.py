"""Azure LLM inference traces (CSV with ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``)."""

from __future__ import annotations

import os

from deepinfer_sched.traces._rows import (
    parse_int,
    parse_time,
    read_csv_rows,
    unique_ids,
)
from deepinfer_sched.traces.types import Trace, TraceRequest

__all__ = ["load_azure"]


def load_azure(
    path: str | os.PathLike[str],
    *,
    block_size: int = 512,
    limit: int | None = None,
    tenant: str = "default",
) -> Trace:
    """Read an Azure LLM inference trace.

    ``TIMESTAMP`` is an ISO date-time (or seconds); arrivals are relative to the earliest row.
    The trace has no prefix information, so every request gets fresh block ids (no reuse).
    ``GeneratedTokens = 0`` becomes 1 (a request always emits a token). Bad rows raise
    ``ValueError`` naming file and line.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    rows: list[tuple[float, int, int]] = []
    for line, row in read_csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        if limit is not None and len(rows) >= limit:
            break
        t = parse_time(row["TIMESTAMP"], "TIMESTAMP", path, line)
        inp = parse_int(row["ContextTokens"], "ContextTokens", path, line)
        out = parse_int(row["GeneratedTokens"], "GeneratedTokens", path, line)
        rows.append((t, inp, max(1, out)))
    return _to_trace(rows, block_size, os.path.basename(os.fspath(path)), tenant)


def _to_trace(
    rows: list[tuple[float, int, int]],
    bs: int,
    name: str,
    tenant: str,
) -> Trace:
    t0 = min(r[0] for r in rows) if rows else 0.0
    next_id = 1
    reqs: list[TraceRequest] = []
    for i, (t, inp, out) in enumerate(rows):
        ids = unique_ids(next_id, inp // bs)
        next_id += len(ids)
        reqs.append(TraceRequest(i, t - t0, inp, out, ids, tenant=tenant))
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace(tuple(reqs), bs, name)
