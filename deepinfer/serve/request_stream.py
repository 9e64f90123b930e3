"""One request in flight (`Tracked`) and what its client sees of it (`Delta`s).

`DeltaMaker` turns the replica's ``output`` messages for one request into deltas, one per
message: which completion advanced (``index``, for ``n`` / ``best_of``), its new text (the
engine already cut stop strings from it and held back text that could start one), its new
tokens with their log-probabilities, and how it ended. It counts the tokens and times the
first token and the gaps after it for the TTFT and inter-token histograms.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepinfer.serve.logprobs import WirePosition
from deepinfer.serve.metrics import ServeMetrics
from deepinfer.serve.params import RequestSpec
from deepinfer.serve.routing import RoutedRequest

if TYPE_CHECKING:
    from deepinfer.serve.replica_handle import ReplicaHandle


@dataclass
class Delta:
    """What one completion of a request produced since its last delta. ``finished``: that
    completion ended (``finish_reason``, ``stop_reason``); ``last``: the whole request ended
    (every completion, or an error), and the usage figures are final."""

    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[WirePosition] | None = None
    finished: bool = False
    last: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    cumulative_logprob: float | None = None
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
    # with --pd: the first token's log-probabilities, scored by the prefill replica
    first_logprobs: list[WirePosition] | None = None
    ended: set[int] = field(default_factory=set)  # completions (indices) that finished

    def on_output(self, message: dict[str, Any]) -> bool:
        """Count a replica ``output`` message; True once every completion has finished."""
        self.streamed += len(message["new_token_ids"])
        if self.first_logprobs is not None and message.get("logprobs"):
            if not message["logprobs"][0]:
                message["logprobs"][0] = self.first_logprobs[0]
            self.first_logprobs = None
        if message["finished"]:
            self.ended.add(int(message.get("index", 0)))
        return len(self.ended) >= self.spec.candidates


class DeltaMaker:
    """Replica messages of one request -> `Delta`s."""

    def __init__(self, tracked: Tracked, metrics: ServeMetrics) -> None:
        self.tracked = tracked
        self.metrics = metrics
        self.completion = 0
        self.ended: set[int] = set()
        self.last: dict[int, float] = {}  # per completion: when its last tokens arrived

    def make(self, message: dict[str, Any]) -> Delta:
        t = self.tracked
        if message["op"] == "error":
            return Delta(
                finished=True,
                last=True,
                finish_reason="error",
                error=str(message["error"]),
                status=int(message.get("status", 503)),
                prompt_tokens=len(t.prompt_ids),
                completion_tokens=self.completion,
            )
        index = int(message.get("index", 0))
        tokens = [int(x) for x in message["new_token_ids"]]
        self._time(index, tokens)
        self.completion += len(tokens)
        done = bool(message["finished"])
        if done:
            self.ended.add(index)
        delta = Delta(
            index=index,
            text=message["new_text"],
            token_ids=tokens,
            logprobs=message.get("logprobs"),
            finished=done,
            last=len(self.ended) >= t.spec.candidates,
            prompt_tokens=int(message.get("prompt_tokens", len(t.prompt_ids))),
            completion_tokens=self.completion,
            cached_tokens=max(int(message.get("cached_tokens", 0)), t.cached_tokens),
        )
        if done:
            reason = message.get("finish_reason")
            if reason in ("abort", "error") or message.get("error"):
                delta.error = message.get("error") or f"the request ended: {reason}"
                delta.status = 503
                delta.last = True
                reason = "error"
            delta.finish_reason = reason
            delta.stop_reason = message.get("stop_reason")
            delta.cumulative_logprob = message.get("cumulative_logprob")
        return delta

    def _time(self, index: int, tokens: list[int]) -> None:
        if not tokens:
            return
        now = time.perf_counter()
        if self.completion == 0:
            self.metrics.ttft.observe(now - self.tracked.arrival)
        elif index in self.last:
            gap = (now - self.last[index]) / len(tokens)  # a speculative step emits several
            for _ in tokens:
                self.metrics.itl.observe(gap)
        self.last[index] = now
