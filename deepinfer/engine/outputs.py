"""What the engine hands back for a request: completions (text, token ids, log-probabilities),
timing and cache figures."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Timing (seconds, ``time.perf_counter`` clock) and prefix-cache figures of one request."""

    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_spec_steps: int = 0
    num_verified_drafts: int = 0
    num_accepted_drafts: int = 0

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability under the model's raw distribution, its rank there (1 = most
    likely) and its text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


# Per generated (or prompt) position: token id -> Logprob, the chosen token first.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One completion of a prompt (``SamplingParams.n`` of them per request).

    ``logprobs`` (when asked) has one entry per token of ``token_ids``; ``cumulative_logprob``
    sums the chosen tokens' (when logprobs or ``best_of`` are in use). ``stop_reason`` is the
    stop string or stop token id that ended it (``None`` for EOS, length or while running).
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request: complete when ``finished``; ``error`` set if it was refused.

    ``outputs`` holds its completions (one unless ``n > 1``), as vLLM's ``RequestOutput``;
    ``text`` / ``token_ids`` / ``finish_reason`` repeat the first completion's.
    ``new_token_ids`` / ``new_text`` hold what this step added to it (for streaming).
    ``prompt_logprobs`` (when asked): ``None`` for the first prompt token, then one entry per
    prompt token.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    metrics: RequestMetrics | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None

    def __post_init__(self) -> None:
        if not self.outputs:
            self.outputs = [
                CompletionOutput(0, self.text, self.token_ids, finish_reason=self.finish_reason)
            ]
