"""A request's `Delta`s -> OpenAI ``choices``: accumulated for a whole response, or one chunk
choice per delta while streaming.

With ``n`` completions the deltas of different ``index`` interleave; each keeps its own text,
log-probabilities and finish reason. With ``best_of > n`` (completions, not streamed) every
candidate runs and the ``n`` of highest cumulative log-probability are returned, renumbered
``0..n-1`` in that order, as OpenAI and vLLM do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepinfer.serve import protocol as P
from deepinfer.serve.logprobs import WirePosition, chat_logprobs, completion_logprobs
from deepinfer.serve.request_stream import Delta


def finish(d: Delta) -> P.FinishReason:
    if not d.finished:
        return None
    return "length" if d.finish_reason == "length" else "stop"


def usage(d: Delta) -> dict[str, Any]:
    return P.usage(d.prompt_tokens, d.completion_tokens, d.cached_tokens)


@dataclass
class Choice:
    """One completion, accumulated from its deltas."""

    index: int
    parts: list[str] = field(default_factory=list)
    logprobs: list[WirePosition] | None = None
    finish: P.FinishReason = None
    stop_reason: str | int | None = None
    cumulative_logprob: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, d: Delta) -> None:
        self.parts.append(d.text)
        if d.logprobs is not None:
            self.logprobs = (self.logprobs or []) + d.logprobs
        if d.finished:
            self.finish = finish(d)
            self.stop_reason = d.stop_reason
            self.cumulative_logprob = d.cumulative_logprob


@dataclass
class Collected:
    """Every delta of a finished request: its choices and the last delta (usage)."""

    choices: dict[int, Choice] = field(default_factory=dict)
    final: Delta | None = None

    def add(self, d: Delta) -> None:
        self.choices.setdefault(d.index, Choice(d.index)).add(d)
        if d.last:
            self.final = d

    def returned(self, n: int) -> list[Choice]:
        """The ``n`` choices to return, renumbered when ``best_of`` ranked them."""
        ordered = [self.choices[i] for i in sorted(self.choices)]
        if len(ordered) <= n:
            return ordered
        best = sorted(ordered, key=lambda c: -(c.cumulative_logprob or 0.0))[:n]
        for i, c in enumerate(best):
            c.index = i
        return best

    def completion_choices(self, n: int, with_logprobs: bool) -> list[dict[str, Any]]:
        out = []
        for c in self.returned(n):
            logprobs = None
            if with_logprobs:
                logprobs, _ = completion_logprobs(c.logprobs or [], 0)
            out.append(P.completion_choice(c.index, c.text, c.finish, logprobs, c.stop_reason))
        return out

    def chat_choices(self, n: int, top: int | None) -> list[dict[str, Any]]:
        out = []
        for c in self.returned(n):
            logprobs = chat_logprobs(c.logprobs or [], top) if top is not None else None
            out.append(P.chat_choice(c.index, c.text, c.finish, logprobs, c.stop_reason))
        return out


class CompletionChunks:
    """Streamed completion choices; keeps each completion's ``text_offset``."""

    def __init__(self, with_logprobs: bool) -> None:
        self.with_logprobs = with_logprobs
        self.offsets: dict[int, int] = {}

    def choice(self, d: Delta) -> dict[str, Any] | None:
        """The chunk choice of a delta, or None when it carries nothing to send."""
        logprobs = None
        if self.with_logprobs and d.logprobs:
            logprobs, self.offsets[d.index] = completion_logprobs(
                d.logprobs, self.offsets.get(d.index, 0)
            )
        if not (d.text or d.finished or logprobs):
            return None
        return P.completion_choice(d.index, d.text, finish(d), logprobs, d.stop_reason)


def chat_role_chunk_choices(n: int) -> list[dict[str, Any]]:
    """The first chunk's choices: each completion's role, before any content."""
    return [P.chat_delta_choice(i, {"role": "assistant", "content": ""}, None) for i in range(n)]


def chat_chunk_choice(d: Delta, top: int | None) -> dict[str, Any] | None:
    """The chunk choice of a delta, or None when it carries nothing to send."""
    logprobs = chat_logprobs(d.logprobs, top) if top is not None and d.logprobs else None
    if not (d.text or d.finished or logprobs):
        return None
    delta = {"content": d.text} if d.text else {}
    return P.chat_delta_choice(d.index, delta, finish(d), logprobs, d.stop_reason)
