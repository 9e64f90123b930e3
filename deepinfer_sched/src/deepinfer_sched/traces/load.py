"""One entry point for every trace source: a file in any supported format, or a synthetic
config."""

from __future__ import annotations

import os

from deepinfer_sched.traces.azure import load_azure
from deepinfer_sched.traces.burstgpt import load_burstgpt
from deepinfer_sched.traces.mooncake import load_mooncake
from deepinfer_sched.traces.types import Trace

__all__ = ["TRACE_FORMATS", "load_trace"]

TRACE_FORMATS = ("auto", "mooncake", "azure", "burstgpt")


def load_trace(
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    block_size: int = 512,
    limit: int | None = None,
    rechain: bool = False,
) -> Trace:
    """Load a trace file. ``format="auto"``: ``.jsonl``/``.json`` is Mooncake; a CSV whose
    header has ``TIMESTAMP`` is Azure, one with ``Request tokens`` is BurstGPT.
    ``rechain`` (Mooncake only) chains per-block ``hash_ids``, see :func:`load_mooncake`."""
    if format not in TRACE_FORMATS:
        raise ValueError(f"format must be one of {TRACE_FORMATS}, got {format!r}")
    if format == "auto":
        format = _detect(path)
    if format == "mooncake":
        return load_mooncake(path, block_size=block_size, limit=limit, rechain=rechain)
    if format == "azure":
        return load_azure(path, block_size=block_size, limit=limit)
    return load_burstgpt(path, block_size=block_size, limit=limit)


def _detect(path: str | os.PathLike[str]) -> str:
    p = os.fspath(path)
    if p.endswith((".jsonl", ".json")):
        return "mooncake"
    with open(p, encoding="utf-8") as f:
        header = f.readline()
    if "TIMESTAMP" in header:
        return "azure"
    if "Request tokens" in header:
        return "burstgpt"
    raise ValueError(
        f"{p}: cannot detect the trace format from the name or header "
        f"{header.strip()!r}; pass format= one of {TRACE_FORMATS[1:]}"
    )
