"""Start `deepinfer serve` for tests: in this process (a uvicorn thread) or as a subprocess,
always on 127.0.0.1 and a free port, always stopped by the test that started it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from deepinfer.serve import ServeConfig


def free_port() -> int:
    """A port free now, for a server in another process (which binds it itself, later: a
    narrow race). A server in this process takes a socket bound now instead: `bound_socket`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bound_socket() -> socket.socket:
    """A socket bound to 127.0.0.1 on a free port, for uvicorn's ``Server.run(sockets=...)``:
    no window between picking the port and binding it in which a server of the other xdist
    worker, or a client's ephemeral port, could take it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def wait_healthy(base: str, timeout: float, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited early with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{base} not healthy within {timeout} s")


def health(base: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{base}/health", timeout=5.0).json()
    return body


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def thread_server(config: ServeConfig, timeout: float = 120.0) -> Iterator[str]:
    """A server in this process (replicas as threads when ``config.in_process``)."""
    import uvicorn

    from deepinfer.serve import ServeService, build_app

    sock = bound_socket()
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(ServeService(config)), host="127.0.0.1", port=port, log_level="warning"
        )
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
        yield base
    finally:
        server.should_exit = True
        thread.join(60.0)
        sock.close()
        assert not thread.is_alive(), "the server thread did not stop"


@contextlib.contextmanager
def process_server(
    args: list[str], env: dict[str, str], timeout: float = 180.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``deepinfer serve ARGS`` as a subprocess; killed (with its replicas) if still running."""
    port = free_port()
    cmd = [sys.executable, "-m", "deepinfer.cli", "serve", *args, "--port", str(port)]
    cmd += ["--log-level", "warning"]
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, timeout, proc)
        yield base, proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def tiny_model(directory: Path) -> Path:
    from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

    cfg = tiny_config(max_position_embeddings=256, tie_word_embeddings=False)
    return write_tiny_gguf(directory / "tiny.gguf", cfg, random_hf_state(cfg, seed=3))
