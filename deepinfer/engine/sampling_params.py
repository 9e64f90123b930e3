"""`SamplingParams`: how one request turns logits into tokens (vLLM's field names and defaults)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from deepinfer_kernels.sampling import (
    LogitsProcessor,
    StructuredOutputsParams,
    penalties_active,
)

# The logprobs a request may ask for per position (vLLM's default cap is 20).
MAX_LOGPROBS = 20


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_or_none(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: v is None or (_int(v) and low <= v <= high)


def _ids(v: Any) -> bool:
    return not isinstance(v, (str, bytes)) and all(_int(t) and t >= 0 for t in v)


# The fields one predicate describes: name -> (test, what the value must be). Checked in this
# order; the error names the field, the rule and the value given.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda v: _number(v) and math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "top_k": (_int, "an int (<= 0 disables it)"),
    "top_p": (lambda v: _number(v) and 0.0 < v <= 1.0, "in (0, 1]"),
    "min_p": (lambda v: _number(v) and 0.0 <= v <= 1.0, "in [0, 1]"),
    "seed": (lambda v: v is None or _int(v), "an int or None"),
    "n": (lambda v: _int(v) and v >= 1, "an int >= 1"),
    "logprobs": (_int_or_none(0, MAX_LOGPROBS), f"None or an int in [0, {MAX_LOGPROBS}]"),
    "prompt_logprobs": (_int_or_none(0, MAX_LOGPROBS), f"None or an int in [0, {MAX_LOGPROBS}]"),
    "max_tokens": (lambda v: _int(v) and v > 0, "an int > 0"),
    "stop_token_ids": (_ids, "a list of non-negative ints"),
    "include_stop_str_in_output": (lambda v: isinstance(v, bool), "a bool"),
    "ignore_eos": (lambda v: isinstance(v, bool), "a bool"),
    "skip_special_tokens": (lambda v: isinstance(v, bool), "a bool"),
    "presence_penalty": (lambda v: _number(v) and -2.0 <= v <= 2.0, "a number in [-2, 2]"),
    "frequency_penalty": (lambda v: _number(v) and -2.0 <= v <= 2.0, "a number in [-2, 2]"),
    "repetition_penalty": (
        lambda v: _number(v) and math.isfinite(v) and v > 0,
        "a finite number > 0",
    ),
    "allowed_token_ids": (
        lambda v: v is None or (bool(v) and _ids(v)),
        "a non-empty list of token ids",
    ),
    "logits_processors": (
        lambda v: not isinstance(v, (str, bytes)) and all(callable(p) for p in v),
        "a list of callables (ids, logits) -> logits",
    ),
    "retention": (
        lambda v: isinstance(v, str) and 0 < len(v.encode()) <= 32,
        "a 1-32 byte class name",
    ),
}


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, as vLLM's ``SamplingParams`` names them.

    Sampling: ``temperature == 0`` is greedy decoding (the default, 1.0, samples). ``top_k <= 0``
    and ``top_p == 1`` disable those filters; ``min_p == 0`` disables min-p. ``seed`` gives the
    request its own random stream.

    Logits processing, applied in this order before temperature: ``repetition_penalty``
    (CTRL-style, on prompt and output tokens: positive logits divided, negative multiplied),
    ``frequency_penalty`` (minus count of each token in the output) and ``presence_penalty``
    (minus once per token present in the output), ``logit_bias`` (added by token id),
    ``allowed_token_ids``, the EOS/stop-token ban while fewer than ``min_tokens`` are out, the
    ``structured_outputs`` token mask, then ``logits_processors`` in order.

    Stopping: after ``max_tokens`` tokens; at EOS (unless ``ignore_eos``) or any id in
    ``stop_token_ids``; when the detokenised output contains one of the ``stop`` strings (matched
    on text, so across token boundaries; the string is cut from the output unless
    ``include_stop_str_in_output``). ``finish_reason`` is ``"stop"`` or ``"length"``;
    ``stop_reason`` says which stop string or token id ended it (``None`` for EOS).

    Several completions: ``n`` per prompt (``RequestOutput.outputs``); with ``best_of > n``
    that many are generated and the ``n`` of highest cumulative log-probability returned.

    Log-probabilities: ``logprobs=k`` returns, per generated token, the chosen token's and the
    top ``k`` (``0``: the chosen one only); ``prompt_logprobs=k`` the same per prompt token.
    They are of the model's raw distribution (``log_softmax`` of the logits before any
    processing, as vLLM's default ``raw_logprobs``).

    Example::

        params = SamplingParams(temperature=0.0, max_tokens=32, stop=["\\n\\n"])
    """

    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    logits_processors: Sequence[LogitsProcessor] = field(default_factory=tuple)
    logit_bias: Mapping[int, float] | None = None
    allowed_token_ids: Sequence[int] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # Prefix cache: the retention class the request's KV blocks are kept under ("chat" 7 days,
    # "agent" 3 days in deepinfer_cache's default policy; the cache's policy validates it).
    retention: str = "chat"

    def __post_init__(self) -> None:
        for name, (ok, rule) in _RULES.items():
            if not ok(getattr(self, name)):
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")
        if self.best_of is not None:
            if not _int(self.best_of) or self.best_of < self.n:
                raise ValueError(f"best_of must be an int >= n ({self.n}), got {self.best_of!r}")
            if self.best_of > 1 and self.temperature == 0:
                raise ValueError("best_of > 1 needs temperature > 0 (greedy candidates are equal)")
        if not _int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens!r}"
            )
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be a str or a list of non-empty str, got {self.stop!r}")
        if self.structured_outputs is not None and not isinstance(
            self.structured_outputs, StructuredOutputsParams
        ):
            raise TypeError(
                "structured_outputs must be a StructuredOutputsParams, got "
                f"{type(self.structured_outputs).__name__}"
            )
        # Lists become tuples: the params are frozen and compare by value.
        object.__setattr__(self, "stop", tuple(stop))
        object.__setattr__(self, "logit_bias", self._checked_bias())
        for name in ("stop_token_ids", "logits_processors", "allowed_token_ids"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))

    def _checked_bias(self) -> dict[int, float] | None:
        if self.logit_bias is None:
            return None
        if not isinstance(self.logit_bias, Mapping):
            raise ValueError(
                f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}"
            )
        bias: dict[int, float] = {}
        for key, value in self.logit_bias.items():
            # JSON (the OpenAI API, PD messages) carries the ids as strings.
            token = int(key) if isinstance(key, str) and key.lstrip("-").isdigit() else key
            if not _int(token) or token < 0 or not _number(value) or not math.isfinite(value):
                raise ValueError(
                    f"logit_bias must map token ids (>= 0) to finite numbers, got {key!r}: {value!r}"
                )
            bias[int(token)] = float(value)
        return bias or None

    # ------------------------------------------------------------------ derived
    @property
    def num_candidates(self) -> int:
        """How many completions run for one prompt (``best_of`` or ``n``)."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def needs_penalties(self) -> bool:
        return penalties_active(
            self.presence_penalty, self.frequency_penalty, self.repetition_penalty
        )

    @property
    def needs_processing(self) -> bool:
        """True when logits are rewritten before sampling (plain requests skip all of it)."""
        return (
            self.needs_penalties
            or self.logit_bias is not None
            or self.allowed_token_ids is not None
            or self.min_tokens > 0
            or self.structured_outputs is not None
            or bool(self.logits_processors)
        )

    @property
    def needs_logprobs(self) -> bool:
        return self.logprobs is not None or self.num_candidates > self.n

    # ------------------------------------------------------------------ JSON
    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields; custom ``logits_processors`` cannot cross a process."""
        if self.logits_processors:
            raise ValueError(
                "logits_processors cannot be sent to another process (PD workers); "
                "run without pd or express the rule as logit_bias / structured_outputs"
            )
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "logits_processors":
                continue
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, StructuredOutputsParams):
                value = value.to_json_dict()
            elif f.name == "logit_bias" and value is not None:
                value = {str(k): v for k, v in value.items()}
            out[f.name] = value
        return out

    @classmethod
    def from_json_dict(cls, raw: Mapping[str, Any]) -> SamplingParams:
        """Inverse of :meth:`to_json_dict`; unknown keys raise ``TypeError`` naming them."""
        values = dict(raw)
        so = values.get("structured_outputs")
        if isinstance(so, Mapping):
            values["structured_outputs"] = StructuredOutputsParams(**so)
        return cls(**values)
