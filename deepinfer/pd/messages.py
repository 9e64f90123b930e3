"""JSON messages between the coordinator and the workers (no pickle crosses a process).

Every message is one JSON object sent with ``Connection.send_bytes``; ``op`` names its kind.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import Any

from deepinfer.engine.outputs import RequestOutput


def send(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message, separators=(",", ":")).encode("utf-8"))


def recv(conn: Connection) -> dict[str, Any]:
    message = json.loads(conn.recv_bytes().decode("utf-8"))
    if not isinstance(message, dict) or "op" not in message:
        raise ValueError(f"malformed PD message: {str(message)[:80]}")
    return message


def output_to_json(out: RequestOutput) -> dict[str, Any]:
    """The parts of an output the coordinator forwards (timings are rebuilt there; the
    speculative-decoding counters of the worker's request are copied)."""
    m = out.metrics
    spec = [m.num_spec_steps, m.num_verified_drafts, m.num_accepted_drafts] if m else [0, 0, 0]
    return {
        "spec": spec,
        "op": "output",
        "request_id": out.request_id,
        "token_ids": list(out.token_ids),
        "text": out.text,
        "new_token_ids": list(out.new_token_ids),
        "new_text": out.new_text,
        "finished": out.finished,
        "finish_reason": out.finish_reason,
        "stop_reason": out.outputs[0].stop_reason if out.outputs else None,
        "error": out.error,
    }
