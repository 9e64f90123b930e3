"""OpenAI request bodies (pydantic) and the response/chunk dictionaries the server sends.

Fields follow the OpenAI API reference. Fields the server knows but cannot honour are still
declared, so a request that sets them gets a 400 naming the field instead of having it ignored
silently (see :mod:`deepinfer.serve.params`). Unknown extra fields are ignored, as OpenAI's own
clients send newer fields than a server may know.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    """Parameters shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None


FinishReason = Literal["stop", "length"] | None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_choice(
    index: int,
    text: str,
    finish: FinishReason,
    logprobs: dict[str, Any] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    """One ``choices[i]`` of a completion or completion chunk. ``stop_reason`` (vLLM's
    extension) names the stop string or token id that ended it (``None`` for EOS)."""
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }


def completion_body(
    rid: str, model: str, choices: list[dict[str, Any]], usage_: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }


def completion_chunk(
    rid: str,
    model: str,
    choices: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A streamed completion chunk; with ``usage_`` it is the final usage-only chunk."""
    body: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [] if usage_ is not None else choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


def chat_choice(
    index: int,
    text: str,
    finish: FinishReason,
    logprobs: dict[str, Any] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs,
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }


def chat_delta_choice(
    index: int,
    delta: dict[str, Any],
    finish: FinishReason,
    logprobs: dict[str, Any] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = stop_reason
    return choice


def chat_body(
    rid: str, model: str, choices: list[dict[str, Any]], usage_: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }


def chat_chunk(
    rid: str,
    model: str,
    choices: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk``; with ``usage_`` it is the final usage-only chunk."""
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [] if usage_ is not None else choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


def models_body(model: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "deepinfer"}],
    }
