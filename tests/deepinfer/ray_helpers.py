"""A `deepinfer serve` front on Ray for tests: the HTTP app in a uvicorn thread of the test
process (127.0.0.1, free port) with its `ServeService` at hand, so a test can reach the replica
handles (actor, node, pid) as well as the HTTP API."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
from serve_helpers import bound_socket, wait_healthy

from deepinfer.serve import ServeConfig

MODEL = "tiny"


@contextlib.contextmanager
def ray_server(config: ServeConfig, timeout: float = 180.0) -> Iterator[tuple[str, Any]]:
    """Yield ``(base_url, service)``; the server (and its actors) stop at exit."""
    import uvicorn

    from deepinfer.serve import ServeService, build_app

    service = ServeService(config)
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(build_app(service), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server failed to start (see its log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{base} did not start within {timeout} s")
            time.sleep(0.05)
        wait_healthy(base, max(1.0, deadline - time.monotonic()))
        yield base, service
    finally:
        server.should_exit = True
        thread.join(90.0)
        sock.close()
        assert not thread.is_alive(), "the server thread did not stop"


def complete(base: str, prompt: Any, max_tokens: int, **extra: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    return httpx.post(f"{base}/v1/completions", json=body, timeout=120)


def open_stream(base: str, prompt: Any, max_tokens: int) -> tuple[httpx.Client, httpx.Response]:
    client = httpx.Client(timeout=120)
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


def sse_events(lines: Iterator[str]) -> list[dict[str, Any] | str]:
    out: list[dict[str, Any] | str] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def sse_text(events: list[dict[str, Any] | str]) -> str:
    return "".join(
        e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices")
    )
