"""OpenAI parameters -> `SamplingParams` (stop strings included: the engine applies them).

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
# Completions one request may run at once (n, best_of): each holds its own KV on one replica,
# so an unbounded n would let one request starve that replica.
MAX_CANDIDATES = 16


@dataclass(frozen=True)
class RequestSpec:
    """What the service needs to run one request besides its prompt. ``params.stop`` holds
    the stop strings, ``params.n`` / ``best_of`` the completions, ``params.logprobs`` the
    alternatives per token (``None``: no log-probabilities)."""

    params: SamplingParams
    namespace: bytes
    include_usage: bool
    stream: bool = False

    @property
    def candidates(self) -> int:
        """Completions that run (``best_of`` when it ranks them, else ``n``)."""
        return self.params.num_candidates


def _fields() -> set[str]:
    return {f.name for f in dataclasses.fields(SamplingParams)}


def build_spec(
    req: CompletionRequest | ChatCompletionRequest, *, default_max_tokens: int | None
) -> RequestSpec:
    """Check ``req``'s parameters and build its `SamplingParams`; raise a 400 `APIError`."""
    known = _fields()
    kw: dict[str, Any] = {}
    # Which OpenAI parameter an engine message about a field is about (when names differ).
    renamed: dict[str, str] = {}
    if not 1 <= req.n <= MAX_CANDIDATES:
        raise bad_request(f"n must be in [1, {MAX_CANDIDATES}], got {req.n}", "n")
    kw["n"] = req.n
    if isinstance(req, CompletionRequest):
        if req.echo:
            raise unsupported("echo")
        if req.suffix:
            raise unsupported("suffix")
        if req.best_of is not None and req.best_of != req.n:
            if req.best_of > MAX_CANDIDATES:
                raise bad_request(
                    f"best_of must be <= {MAX_CANDIDATES}, got {req.best_of}", "best_of"
                )
            if req.stream and req.best_of > req.n:
                raise bad_request(
                    "best_of > n cannot stream: the best completions are known at the end",
                    "best_of",
                )
            kw["best_of"] = req.best_of
        if req.logprobs is not None:
            kw["logprobs"] = req.logprobs
        max_tokens = req.max_tokens
    else:
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
        if req.logprobs:
            kw["logprobs"] = req.top_logprobs or 0
            renamed["logprobs"] = "top_logprobs"
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
    if req.min_tokens:
        kw["min_tokens"] = req.min_tokens
    if req.include_stop_str_in_output:
        kw["include_stop_str_in_output"] = True
    stop = _stop_strings(req.stop)
    if stop:
        kw["stop"] = stop
    try:
        params = SamplingParams(**kw)
    except (ValueError, TypeError) as exc:
        param = _param_of(str(exc), kw)
        raise bad_request(str(exc), renamed.get(param or "", param)) from exc
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed with stream=true", "stream_options")
    namespace = b"" if req.user is None else b"user:" + req.user.encode("utf-8")
    return RequestSpec(params, namespace, include_usage, req.stream)


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
