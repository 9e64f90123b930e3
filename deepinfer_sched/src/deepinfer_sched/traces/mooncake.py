"""Mooncake-format JSONL traces: one object per line with ``timestamp`` (ms),
``input_length``, ``output_length`` and ``hash_ids`` (one chained id per prompt block)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

from deepinfer_sched.traces._rows import RowError, parse_float, parse_int
from deepinfer_sched.traces.types import Trace, TraceRequest, check_chained, rechain_ids

__all__ = ["load_mooncake", "save_jsonl"]


def load_mooncake(
    path: str | os.PathLike[str],
    *,
    block_size: int = 512,
    limit: int | None = None,
    rechain: bool = False,
) -> Trace:
    """Read a Mooncake JSONL trace (``arrival_s = timestamp / 1000``).

    ``hash_ids`` may cover the trailing partial block (ceil) or not (floor); only the ids of
    full blocks are kept. Optional keys ``request_id``, ``tenant``, ``conversation_id``,
    ``kind`` and ``priority`` (written by :func:`save_jsonl`) are read back. Requests are
    ordered by arrival (stable). Any bad line raises ``ValueError`` naming file and line.

    ``hash_ids`` must be prefix-chained (an id names the whole prefix up to its block: it has
    the same predecessor wherever it appears, and never repeats within a line); anything
    else is an error naming the line. ``rechain=True`` instead reads them as per-block
    content ids and chains them (:func:`~deepinfer_sched.traces.types.rechain_ids`).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    reqs: list[TraceRequest] = []
    raw_ids: list[tuple[int, ...]] = []
    lines: list[int] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if limit is not None and len(reqs) >= limit:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise RowError(path, line_no, f"invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise RowError(path, line_no, "expected a JSON object")
            req, ids = _request(obj, len(reqs), block_size, path, line_no, rechain)
            reqs.append(req)
            raw_ids.append(ids)
            lines.append(line_no)
    if rechain:
        # Chained in file order, which is arrival order for any well-formed trace.
        chained = rechain_ids(raw_ids)
        reqs = [replace(r, block_hashes=h) for r, h in zip(reqs, chained, strict=True)]
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_s)
    ordered = tuple(reqs[i] for i in order)
    check_chained(ordered, lambda i: f"{os.fspath(path)}:{lines[order[i]]}")
    try:
        return Trace(ordered, block_size, os.path.basename(os.fspath(path)))
    except ValueError as e:
        raise ValueError(f"{os.fspath(path)}: {e}") from None


def _request(
    obj: dict[str, object],
    index: int,
    bs: int,
    path: str | os.PathLike[str],
    line: int,
    rechain: bool,
) -> tuple[TraceRequest, tuple[int, ...]]:
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise RowError(path, line, f"missing key {key!r}")
    arrival = parse_float(obj["timestamp"], "timestamp", path, line) / 1000.0
    inp = parse_int(obj["input_length"], "input_length", path, line)
    out = parse_int(obj["output_length"], "output_length", path, line, minimum=1)
    raw = obj["hash_ids"]
    if not isinstance(raw, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in raw
    ):
        raise RowError(path, line, f"hash_ids: expected a list of integers, got {raw!r:.80}")
    full, ceil = inp // bs, -(-inp // bs)
    if not full <= len(raw) <= ceil:
        raise RowError(
            path,
            line,
            f"hash_ids has {len(raw)} ids, expected {full} or {ceil} "
            f"for input_length {inp} at block_size {bs}",
        )
    tenant = _optional_str(obj, "tenant", "default", path, line)
    kind = _optional_str(obj, "kind", "chat", path, line)
    conv = obj.get("conversation_id", -1)
    conv_id = parse_int(conv, "conversation_id", path, line, minimum=-1)
    priority = parse_int(obj.get("priority", 0), "priority", path, line, minimum=-(2**62))
    rid = parse_int(obj["request_id"], "request_id", path, line) if "request_id" in obj else index
    ids = tuple(raw[:full])
    # With rechain, repeats are legal per-block content ids: they are chained (made
    # distinct) once the whole file is read, so the request starts with placeholder ids.
    held = tuple(range(full)) if rechain else ids
    try:
        req = TraceRequest(rid, arrival, inp, out, held, tenant, conv_id, kind, priority)
    except (TypeError, ValueError) as e:
        raise RowError(path, line, f"hash_ids: {e}") from None
    return req, ids


def _optional_str(
    obj: dict[str, object], key: str, default: str, path: str | os.PathLike[str], line: int
) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise RowError(path, line, f"{key}: expected a string, got {value!r}")
    return value


def save_jsonl(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` as Mooncake JSONL (``timestamp`` in ms, full-block ``hash_ids``) plus
    the keys :func:`load_mooncake` reads back, so a save/load round trip keeps every field
    (arrival times up to float rounding of the ms conversion)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in trace:
            obj = {
                "timestamp": r.arrival_s * 1000.0,
                "input_length": r.input_len,
                "output_length": r.output_len,
                "hash_ids": list(r.block_hashes),
                "request_id": r.request_id,
                "tenant": r.tenant,
                "conversation_id": r.conversation_id,
                "kind": r.kind,
                "priority": r.priority,
            }
            f.write(json.dumps(obj, separators=(",", ":")))
            f.write("\n")
