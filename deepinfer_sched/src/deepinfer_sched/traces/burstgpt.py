"""BurstGPT traces (CSV: ``Timestamp, Model, Request tokens, Response tokens, Total tokens,
Log Type``)."""

from __future__ import annotations

import os

from deepinfer_sched.traces._rows import RowError, parse_float, parse_int, read_csv_rows
from deepinfer_sched.traces.types import Trace, TraceRequest

__all__ = ["load_burstgpt"]

_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


def load_burstgpt(
    path: str | os.PathLike[str],
    *,
    block_size: int = 512,
    limit: int | None = None,
    model: str | None = None,
) -> Trace:
    """Read a BurstGPT trace (``Timestamp`` in seconds, kept as is).

    ``tenant`` is the ``Model`` column; ``kind`` is ``"chat"`` for conversation logs and
    ``"api"`` otherwise. ``model`` keeps only rows of that model. ``Total tokens`` must equal
    request + response tokens. The trace has no prefix information, so every request gets
    fresh block ids; ``Response tokens = 0`` (failed requests) becomes 1. Bad rows raise
    ``ValueError`` naming file and line.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    reqs: list[TraceRequest] = []
    next_id = 1
    for line, row in read_csv_rows(path, _COLUMNS):
        if limit is not None and len(reqs) >= limit:
            break
        t = parse_float(row["Timestamp"], "Timestamp", path, line)
        name = row["Model"].strip()
        if not name:
            raise RowError(path, line, "column 'Model': empty")
        inp = parse_int(row["Request tokens"], "Request tokens", path, line)
        out = parse_int(row["Response tokens"], "Response tokens", path, line)
        total = parse_int(row["Total tokens"], "Total tokens", path, line)
        if total != inp + out:
            raise RowError(path, line, f"'Total tokens' {total} != request {inp} + response {out}")
        if model is not None and name != model:
            continue
        kind = "chat" if "conversation" in row["Log Type"].lower() else "api"
        ids = tuple(range(next_id, next_id + inp // block_size))
        next_id += len(ids)
        reqs.append(TraceRequest(len(reqs), t, inp, max(1, out), ids, tenant=name, kind=kind))
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace(tuple(reqs), block_size, os.path.basename(os.fspath(path)))
