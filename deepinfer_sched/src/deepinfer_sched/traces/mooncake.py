"""Mooncake-format JSONL traces: one object per line with ``timestamp`` (ms),
``input_length``, ``output_length`` and ``hash_ids`` (one chained id per prompt block)."""

from __future__ import annotations

import json
import os

from deepinfer_sched.traces._rows import RowError, parse_float, parse_int
from deepinfer_sched.traces.types import Trace, TraceRequest

__all__ = ["load_mooncake", "save_jsonl"]


def load_mooncake(
    path: str | os.PathLike[str], *, block_size: int = 512, limit: int | None = None
) -> Trace:
    """Read a Mooncake JSONL trace (``arrival_s = timestamp / 1000``).

    ``hash_ids`` may cover the trailing partial block (ceil) or not (floor); only the ids of
    full blocks are kept. Optional keys ``request_id``, ``tenant``, ``conversation_id``,
    ``kind`` and ``priority`` (written by :func:`save_jsonl`) are read back. Requests are
    ordered by arrival (stable). Any bad line raises ``ValueError`` naming file and line.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    reqs: list[TraceRequest] = []
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
            reqs.append(_request(obj, len(reqs), block_size, path, line_no))
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace(tuple(reqs), block_size, os.path.basename(os.fspath(path)))


def _request(
    obj: dict[str, object], index: int, bs: int, path: str | os.PathLike[str], line: int
) -> TraceRequest:
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
    return TraceRequest(rid, arrival, inp, out, tuple(raw[:full]), tenant, conv_id, kind, priority)


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
