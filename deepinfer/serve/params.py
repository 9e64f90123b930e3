"""OpenAI parameters -> `SamplingParams` (plus the stop strings the server applies itself).

Each parameter maps onto a `SamplingParams` field when the engine has one; a parameter set to
a value the engine cannot honour is a 400 that names it, never silently dropped. The engine's
own validation (``SamplingParams.__post_init__``) names the field too; its message is passed on
with the OpenAI name of the parameter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.serve.errors import APIError, bad_request, unsupported
from deepinfer.serve.protocol import ChatCompletionRequest, CompletionRequest

# OpenAI name -> SamplingParams field, for parameters whose neutral value means "off".
_OPTIONAL = {
    "presence_penalty": ("presence_penalty", 0.0),
    "frequency_penalty": ("frequency_penalty", 0.0),
    "repetition_penalty": ("repetition_penalty", 1.0),
}
MAX_STOP_STRINGS = 4  # OpenAI's documented limit
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class RequestSpec:
    """What the service needs to run one request besides its prompt."""

    params: SamplingParams
    stop: tuple[str, ...]
    namespace: bytes
    include_usage: bool


def _fields() -> set[str]:
    return {f.name for f in dataclasses.fields(SamplingParams)}


def build_spec(
    req: CompletionRequest | ChatCompletionRequest, *, default_max_tokens: int | None
) -> RequestSpec:
    """Check ``req``'s parameters and build its `SamplingParams`; raise a 400 `APIError`."""
    known = _fields()
    kw: dict[str, Any] = {}
    if req.n != 1:
        raise unsupported("n", "must be 1: this server returns one choice per request")
    if isinstance(req, CompletionRequest):
        if req.echo:
            raise unsupported("echo")
        if req.suffix:
            raise unsupported("suffix")
        if req.best_of not in (None, 1):
            raise unsupported("best_of", "must be 1")
        if req.logprobs:
            raise unsupported("logprobs", "is not supported by this engine yet")
        max_tokens = req.max_tokens
    else:
        if req.logprobs or req.top_logprobs:
            raise unsupported(
                "top_logprobs" if req.top_logprobs else "logprobs",
                "is not supported by this engine yet",
            )
        if req.tools:
            raise unsupported("tools")
        if req.response_format and req.response_format.get("type") not in (None, "text"):
            raise unsupported("response_format", "must be {'type': 'text'}")
        both = req.max_completion_tokens is not None and req.max_tokens is not None
        if both and req.max_completion_tokens != req.max_tokens:
            raise bad_request(
                "max_tokens and max_completion_tokens disagree; give one",
                "max_completion_tokens",
            )
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
    if req.logit_bias:
        if "logit_bias" not in known:
            raise unsupported("logit_bias", "is not supported by this engine yet")
        try:
            kw["logit_bias"] = {int(k): float(v) for k, v in req.logit_bias.items()}
        except ValueError as exc:
            raise bad_request("logit_bias: keys must be token ids", "logit_bias") from exc
    if max_tokens is None:
        max_tokens = default_max_tokens
    if max_tokens is not None:
        if max_tokens < 1:
            raise bad_request(f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
        kw["max_tokens"] = max_tokens
    for name in ("temperature", "top_p", "top_k", "min_p", "seed"):
        value = getattr(req, name)
        if value is not None:
            kw[name] = value
    if req.top_k is not None and req.top_k == 0:
        kw["top_k"] = -1  # OpenAI-style clients use 0 for "off"; the engine uses <= 0
    for name, (field, neutral) in _OPTIONAL.items():
        value = getattr(req, name)
        if value is None or value == neutral:
            continue
        if field not in known:
            raise unsupported(name, "is not supported by this engine yet")
        kw[field] = value
    if req.stop_token_ids:
        kw["stop_token_ids"] = tuple(req.stop_token_ids)
    if req.ignore_eos:
        kw["ignore_eos"] = True
    stop = _stop_strings(req.stop)
    try:
        params = SamplingParams(**kw)
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc), _param_of(str(exc), kw)) from exc
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed with stream=true", "stream_options")
    namespace = b"" if req.user is None else b"user:" + req.user.encode("utf-8")
    return RequestSpec(params, stop, namespace, include_usage)


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    values = [stop] if isinstance(stop, str) else list(stop)
    if len(values) > MAX_STOP_STRINGS:
        raise bad_request(f"stop: at most {MAX_STOP_STRINGS} strings, got {len(values)}", "stop")
    if any(v == "" for v in values):
        raise bad_request("stop: strings must not be empty", "stop")
    return tuple(values)


def _param_of(message: str, kw: dict[str, Any]) -> str | None:
    """The parameter an engine validation message is about (it starts with the field name)."""
    for name in sorted(kw, key=len, reverse=True):
        if message.startswith(name):
            return name
    return None


def check_model(requested: str, served: str) -> None:
    from deepinfer.serve.errors import model_not_found

    if requested != served:
        raise model_not_found(requested)


__all__ = ["APIError", "RequestSpec", "build_spec", "check_model"]
