"""`RequestState`: what sampling and output processing remember about one request.

The engine's `Sequence` carries it (``seq.state``); `OutputProcessor.track` builds it and
`OutputProcessor.append` advances it, so the sampler and the speculative verifier read one
consistent picture: the detokeniser, the stop-string matcher, the grammar matcher, the
tokens banned before ``min_tokens``, and the log-probabilities gathered so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.engine.outputs import PositionLogprobs
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.stop_strings import StopStringMatcher
from deepinfer.models.tokenizer import IncrementalDetokenizer
from deepinfer_kernels.sampling import GrammarMatcher


@dataclass
class RequestState:
    """Per-request sampling state (see the module docstring)."""

    params: SamplingParams
    detokenizer: IncrementalDetokenizer | None = None
    stop_strings: StopStringMatcher | None = None
    grammar: GrammarMatcher | None = None
    # EOS (unless ignore_eos) and stop token ids: masked while fewer than min_tokens are out.
    early_banned: tuple[int, ...] = ()
    # Raw log-probability rows [W, V] of the next W emitted tokens (set by the sampler or the
    # verifier, consumed by OutputProcessor.append).
    pending_logprobs: torch.Tensor | None = None
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    stop_reason: str | int | None = None
    # The token that ends the request when nothing else is allowed (see rescue_dead_rows),
    # and whether that happened (the request then finishes as "abort").
    eos_token_id: int | None = None
    dead_end: bool = False

    def __post_init__(self) -> None:
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.needs_logprobs:
            self.cumulative_logprob = 0.0
