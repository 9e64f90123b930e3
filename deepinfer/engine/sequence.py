"""`Sequence`: the engine's bookkeeping for one request in flight."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from deepinfer.engine.outputs import RequestMetrics
from deepinfer.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from deepinfer.engine.request_state import RequestState


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """Tokens, KV blocks and progress of one request.

    ``num_computed`` counts the leading tokens whose K/V sit in ``block_ids``. A sequence
    decodes when every token but the last sampled one has KV (``num_computed == len - 1``);
    before that it prefills up to ``prefill_target`` (the prompt, or after a preemption by
    recompute, the prompt plus everything generated so far).
    """

    seq_id: int
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    namespace: bytes
    metrics: RequestMetrics
    priority: int = 0
    output_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    prefill_target: int = 0
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    text: str = ""
    # Sampling and output state (detokenizer, stop strings, grammar, logprobs): built by
    # OutputProcessor.track when the request is added.
    state: RequestState | None = None
    # The prefix cache's chained hashes of this sequence's full blocks, extended as tokens
    # arrive so no block is hashed twice (made by the cache; see prefix_cache.block_hashes).
    block_hashes: Any = None

    def __post_init__(self) -> None:
        self.prefill_target = len(self.prompt_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def ids_between(self, start: int, end: int) -> list[int]:
        """``all_ids[start:end]`` (``0 <= start``) without joining prompt and output first: a
        decode step reads one token, and the join copied the whole context each step."""
        split = len(self.prompt_ids)
        if start >= split:
            return self.output_ids[start - split : end - split]
        if end <= split:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[: end - split]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target

    def blocks_needed(self, num_tokens: int, block_size: int) -> int:
        """How many more blocks holding ``num_tokens`` tokens of KV would take."""
        return max(0, -(-num_tokens // block_size) - len(self.block_ids))
