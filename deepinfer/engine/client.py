"""`EngineClient`: the one interface `LLM` drives, wherever its requests run.

`LocalClient` steps one `LLMEngine` in this process; ``deepinfer.pd.PDCoordinator`` implements
the same three methods over worker processes, so `LLM.generate`, `stream` and `chat` have a
single code path for both modes. A closed `LLM` holds a `ClosedClient`, which refuses requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams


class EngineClient(Protocol):
    """What `LLM` needs from where requests run: one engine here, or PD worker processes."""

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, namespace: bytes = b""
    ) -> tuple[str, RequestOutput | None]:
        """Queue one request: its id, and an error output if it was refused at once
        (``ValueError``/``TypeError`` may also be raised for bad input)."""
        ...

    def run_until(self, request_ids: set[str]) -> Iterator[RequestOutput]:
        """Yield outputs (of these and any other queued requests) until all of
        ``request_ids`` finished."""
        ...

    def close(self) -> None: ...


class LocalClient:
    """Runs requests on one :class:`LLMEngine` in this process; ``on_close`` releases what the
    engine was built with (its prefix-cache store)."""

    def __init__(self, engine: LLMEngine, on_close: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self._on_close = on_close

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, namespace: bytes = b""
    ) -> tuple[str, RequestOutput | None]:
        return self.engine.add_request(prompt_ids, params, namespace=namespace), None

    def run_until(self, request_ids: set[str]) -> Iterator[RequestOutput]:
        pending = set(request_ids)
        try:
            while pending and self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished:
                        pending.discard(out.request_id)
                    yield out
        finally:
            # The caller stopped early (a stream it left) or the engine raised: these requests
            # must not stay queued and run inside the next call.
            for rid in pending:
                self.engine.abort(rid)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


class ClosedClient:
    """The client of a closed `LLM`: every request is refused."""

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, namespace: bytes = b""
    ) -> tuple[str, RequestOutput | None]:
        raise RuntimeError("this LLM is closed")

    def run_until(self, request_ids: set[str]) -> Iterator[RequestOutput]:
        raise RuntimeError("this LLM is closed")

    def close(self) -> None:
        pass
