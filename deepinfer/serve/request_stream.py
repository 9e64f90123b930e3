"""One request in flight (`Tracked`) and what its client sees of it (`Delta`s).

`DeltaMaker` turns the replica's ``output`` messages for one request into deltas: it applies
the stop strings to the text, counts the tokens, and times the first token and the gaps after
it for the TTFT and inter-token histograms.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepinfer.serve.metrics import ServeMetrics
from deepinfer.serve.params import RequestSpec
from deepinfer.serve.routing import RoutedRequest
from deepinfer.serve.stop import StopMatcher

if TYPE_CHECKING:
    from deepinfer.serve.replica_handle import ReplicaHandle


@dataclass
class Delta:
    """What a request produced since the last delta (the final one has ``finished``)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    status: int = 200  # the HTTP status an error deserves (400 refused, 503 replica failure)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class Tracked:
    """One request in flight: what to run, where it runs, and its message queue."""

    request_id: str
    prompt_ids: list[int]
    spec: RequestSpec
    routed: RoutedRequest
    queue: asyncio.Queue[dict[str, Any]]
    arrival: float
    replica: ReplicaHandle | None = None
    streamed: int = 0
    attempts: int = 0
    done: bool = False
    kv: dict[str, Any] | None = None  # with --pd: the KV handle sent to the decode replica
    cached_tokens: int = 0  # with --pd: the prefix hits of its prefill


class DeltaMaker:
    """Replica messages of one request -> `Delta`s."""

    def __init__(self, tracked: Tracked, metrics: ServeMetrics) -> None:
        self.tracked = tracked
        self.metrics = metrics
        self.stop = StopMatcher(tracked.spec.stop)
        self.completion = 0
        self.last = tracked.arrival
        self.stopped_early = False  # a stop string ended it before the engine did

    def make(self, message: dict[str, Any]) -> Delta:
        t = self.tracked
        if message["op"] == "error":
            return Delta(
                finished=True,
                finish_reason="error",
                error=str(message["error"]),
                status=int(message.get("status", 503)),
                prompt_tokens=len(t.prompt_ids),
                completion_tokens=self.completion,
            )
        tokens = [int(x) for x in message["new_token_ids"]]
        self._time(tokens)
        self.completion += len(tokens)
        text = self.stop.feed(message["new_text"])
        engine_done = bool(message["finished"])
        done = engine_done or self.stop.stopped
        if engine_done and not self.stop.stopped:
            text += self.stop.flush()
        delta = Delta(
            text=text,
            token_ids=tokens,
            finished=done,
            prompt_tokens=int(message.get("prompt_tokens", len(t.prompt_ids))),
            completion_tokens=self.completion,
            cached_tokens=max(int(message.get("cached_tokens", 0)), t.cached_tokens),
        )
        if done:
            reason = "stop" if self.stop.stopped else message.get("finish_reason")
            if reason in ("abort", "error"):
                delta.error = message.get("error") or f"the request ended: {reason}"
                delta.status = 503
                reason = "error"
            delta.finish_reason = reason
            self.stopped_early = self.stop.stopped and not engine_done
        return delta

    def _time(self, tokens: list[int]) -> None:
        if not tokens:
            return
        now = time.perf_counter()
        if self.completion == 0:
            self.metrics.ttft.observe(now - self.tracked.arrival)
        else:
            gap = (now - self.last) / len(tokens)  # a speculative step emits several at once
            for _ in tokens:
                self.metrics.itl.observe(gap)
        self.last = now
