"""What the engine hands back for a request: text, token ids, timing and cache figures."""

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
    cached_tokens_per_tier: dict[str, int] = field(default_factory=dict)
    num_spec_steps: int = 0
    num_verified_drafts: int = 0
    num_accepted_drafts: int = 0

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    """The state of one request: complete when ``finished``; ``error`` set if it was refused.

    ``new_token_ids`` / ``new_text`` hold what this step added (for streaming);
    ``token_ids`` / ``text`` hold everything generated so far.
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
