"""Faults and shutdown of `deepinfer serve` with replica processes (a subprocess server).

One server, in order: a replica killed mid-stream ends the request that had streamed tokens
with a clear error, while the request queued there without tokens is retried on the other
replica and completes; the dead replica restarts and serves again; SIGTERM then drains: new
requests get 503, the in-flight stream finishes, the replicas exit and their prefix caches'
disk tiers are flushed.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
from serve_helpers import health, process_server, tiny_model, wait_for

pytest.importorskip("fastapi")
pytestmark = pytest.mark.slow

MODEL = "tiny"


def _open(base: str, prompt: str, max_tokens: int) -> tuple[httpx.Client, httpx.Response]:
    client = httpx.Client(timeout=60)
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    request = client.build_request("POST", f"{base}/v1/completions", json=body)
    return client, client.send(request, stream=True)


def _events(response: httpx.Response) -> list[dict[str, object] | str]:
    out: list[dict[str, object] | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _text(events: list[dict[str, object] | str]) -> str:
    parts = []
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            parts.append(e["choices"][0]["text"])  # type: ignore[index]
    return "".join(parts)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_replica_death_retry_restart_then_sigterm_drains(tmp_path: Path) -> None:
    gguf = tiny_model(tmp_path)
    kv = tmp_path / "kv"
    args = [
        str(gguf),
        "--served-model-name",
        MODEL,
        "--replicas",
        "2",
        "--router",
        "round_robin",
        "--num-blocks",
        "96",
        "--block-size",
        "8",
        "--max-model-len",
        "256",
        "--cache-dir",
        str(kv),
        "--drain-timeout",
        "60",
    ]
    env: dict[str, str] = {}
    with process_server(args, env) as (base, proc):
        reps = health(base)["replicas"]
        pids = {r["index"]: r["pid"] for r in reps}
        assert all(isinstance(p, int) and _alive(p) for p in pids.values())
        expected = httpx.post(
            f"{base}/v1/completions",
            json={
                "model": MODEL,
                "prompt": "queued here",
                "max_tokens": 20,
                "temperature": 0,
                "ignore_eos": True,
            },
            timeout=60,
        ).json()["choices"][0]["text"]

        # A stream with tokens out, then its replica frozen so it cannot finish.
        c_mid, mid = _open(base, "the long answer", 200)
        victim = int(mid.headers["x-deepinfer-replica"])
        lines = mid.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        os.kill(pids[victim], signal.SIGSTOP)
        # A request routed to the frozen replica: queued there, no token streamed yet.
        queued = None
        for _ in range(4):
            c_q, r_q = _open(base, "queued here", 20)
            if int(r_q.headers["x-deepinfer-replica"]) == victim:
                queued = (c_q, r_q)
                break
            _events(r_q)
            c_q.close()
        assert queued is not None, "round robin never routed to the frozen replica"
        os.kill(pids[victim], signal.SIGKILL)

        rest = [
            json.loads(x[6:]) if x != "data: [DONE]" else x for x in lines if x.startswith("data: ")
        ]
        assert rest[-1] == "data: [DONE]"
        errors = [e for e in rest if isinstance(e, dict) and "error" in e]
        assert errors and "streamed" in errors[0]["error"]["message"]
        c_mid.close()
        retried = _events(queued[1])
        queued[0].close()
        assert not [e for e in retried if isinstance(e, dict) and "error" in e]
        assert _text(retried) == expected  # re-run from scratch on the other replica

        def rejoined() -> bool:
            rep = health(base)["replicas"][victim]
            return rep["status"] == "up" and rep["restarts"] == 1 and rep["pid"] != pids[victim]

        wait_for(rejoined, 120.0, "the killed replica to restart and rejoin")
        served_by = set()
        for _ in range(4):
            r = httpx.post(
                f"{base}/v1/completions",
                json={"model": MODEL, "prompt": "hello again", "max_tokens": 3},
                timeout=60,
            )
            assert r.status_code == 200
            served_by.add(int(r.headers["x-deepinfer-replica"]))
        assert served_by == {0, 1}

        # SIGTERM drains: the stream in flight finishes, new requests get 503.
        c_d, drained = _open(base, "drain me", 120)
        dlines = drained.iter_lines()
        assert next(line for line in dlines if line.startswith("data: {"))
        pids = {r["index"]: r["pid"] for r in health(base)["replicas"]}
        # The stream's replica is frozen while the drain starts and a new request is refused:
        # the drain ends when the stream does (~120 tiny-model steps, under a second), so a
        # slow poll here could race the server's exit. Thawed below, the stream then finishes.
        holder = pids[int(drained.headers["x-deepinfer-replica"])]
        os.kill(holder, signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: health(base)["status"] == "draining", 10.0, "the drain to start")
        refused = httpx.post(
            f"{base}/v1/completions",
            json={"model": MODEL, "prompt": "late", "max_tokens": 2},
            timeout=30,
        )
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "service_unavailable"
        os.kill(holder, signal.SIGCONT)
        tail = [x for x in dlines if x.startswith("data: ")]
        assert tail[-1] == "data: [DONE]"
        finals = [json.loads(x[6:]) for x in tail[:-1]]
        assert not [e for e in finals if "error" in e]
        assert finals[-1]["choices"][0]["finish_reason"] == "length"
        c_d.close()
        assert proc.wait(90) == 0
        assert not any(_alive(p) for p in pids.values())
    flushed = [
        f
        for d in tmp_path.glob("kv-replica-*")
        for f in d.rglob("*")
        if f.is_file() and "lock" not in f.name
    ]
    assert flushed, "no replica flushed its prefix cache to its disk tier"
