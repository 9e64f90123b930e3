"""Log-probabilities across the replica pipe and into OpenAI's two response shapes.

A replica sends, per generated token, a list of ``[token_id, logprob, rank, text]`` entries,
the chosen token's first and then the top alternatives the request asked for (the engine's
`PositionLogprobs` in JSON form; a position the engine never scored, such as a PD request's
first token before the front patches it in, is an empty list). The front turns them into:

- ``/v1/completions`` (legacy ``logprobs=k``): ``tokens``, ``token_logprobs``,
  ``top_logprobs`` (a dict per token: the top ``k`` plus the chosen token, so up to ``k + 1``
  entries, as OpenAI documents) and ``text_offset``;
- ``/v1/chat/completions`` (``logprobs=true``, ``top_logprobs=k``): ``content``, one entry per
  token with ``token``, ``logprob``, ``bytes`` and exactly the ``k`` most likely alternatives.

Log-probabilities are of the model's raw distribution (before temperature and penalties), as
vLLM reports them by default. ``-inf`` (a token the model rules out entirely) is sent as
``-9999.0``, as vLLM does, because JSON has no infinity and OpenAI clients reject it.
"""

from __future__ import annotations

import math
from typing import Any

from deepinfer.engine.outputs import PositionLogprobs

FLOOR = -9999.0  # stands in for -inf (and NaN) on the wire

# One scored position on the pipe: [[token_id, logprob, rank, text], ...], chosen first.
WirePosition = list[list[Any]]


def to_wire(positions: list[PositionLogprobs]) -> list[WirePosition]:
    """Engine positions -> JSON-able lists (no pickle crosses the replica pipe)."""
    return [
        [[int(t), _finite(lp.logprob), int(lp.rank), lp.decoded_token] for t, lp in p.items()]
        for p in positions
    ]


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else FLOOR


def _text(entry: list[Any]) -> str:
    return entry[3] if isinstance(entry[3], str) else ""


def _top(position: WirePosition, k: int) -> list[list[Any]]:
    """The ``k`` most likely entries of a position, by rank (ties keep the engine's order)."""
    ranked = sorted(position, key=lambda e: e[2])
    return [e for e in ranked if e[2] <= k][:k]


def completion_logprobs(positions: list[WirePosition], offset: int) -> tuple[dict[str, Any], int]:
    """The legacy completions ``logprobs`` object for some generated tokens whose text starts
    at character ``offset`` of the choice's text; returns it and the offset after them."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for position in positions:
        offsets.append(offset)
        if not position:
            tokens.append("")
            token_logprobs.append(None)
            top.append(None)
            continue
        chosen = position[0]
        text = _text(chosen)
        tokens.append(text)
        token_logprobs.append(float(chosen[1]))
        top.append({_text(e): float(e[1]) for e in position})
        offset += len(text)
    body = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }
    return body, offset


def chat_logprobs(positions: list[WirePosition], k: int) -> dict[str, Any]:
    """The chat ``logprobs`` object (``{"content": [...]}``) with ``k`` alternatives each."""
    content = []
    for position in positions:
        if not position:
            continue  # never scored (cannot happen once the front patched PD's first token)
        chosen = position[0]
        content.append(
            {
                **_chat_entry(chosen),
                "top_logprobs": [_chat_entry(e) for e in _top(position, k)],
            }
        )
    return {"content": content}


def _chat_entry(entry: list[Any]) -> dict[str, Any]:
    text = _text(entry)
    return {"token": text, "logprob": float(entry[1]), "bytes": list(text.encode("utf-8"))}
