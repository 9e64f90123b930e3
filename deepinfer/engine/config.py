"""`EngineConfig`: sizes and limits of one engine instance; `SpeculativeConfig`: how it drafts;
`torch_dtype`: the weight dtypes a ``dtype`` argument may name."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a ``dtype`` argument names; ``ValueError`` lists the choices."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


@dataclass(frozen=True)
class EngineConfig:
    """KV pool size, batching limits and the context limit of one engine.

    ``max_model_len`` of ``None`` means the model's ``max_position_embeddings``.
    """

    block_size: int = 16
    num_blocks: int = 2048
    max_num_seqs: int = 32
    max_batched_tokens: int = 2048
    chunked_prefill: bool = True
    max_model_len: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        for name in ("num_blocks", "max_num_seqs", "max_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """DSpark speculative decoding, in a form that crosses processes (PD workers, replicas).

    ``model``: ``"dspark"`` (the drafter shipped for the embedded model) or a ``deepinfer-spec``
    drafter checkpoint directory. ``num_speculative_tokens``: ``None`` lets DSpark's prefix
    scheduler choose per step how many drafts to verify, from the drafts' confidence and the
    target's step times profiled at start; an int ``k`` verifies ``min(k, gamma)`` drafts of
    every drafting row (vLLM's fixed ``num_speculative_tokens``; ``0`` drafts nothing).
    ``draft_gate``: pause drafting while it does not pay on this machine (measured); ``False``
    drafts on every decode step. Neither setting changes the output distribution.

    Example::

        LLM(speculative=SpeculativeConfig("dspark", num_speculative_tokens=3))
    """

    model: str = "dspark"
    num_speculative_tokens: int | None = None
    draft_gate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not os.fspath(self.model):
            raise ValueError(
                f"model: expected 'dspark' or a drafter checkpoint directory, got {self.model!r}"
            )
        object.__setattr__(self, "model", os.fspath(self.model))
        k = self.num_speculative_tokens
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
            raise ValueError(f"num_speculative_tokens: expected None or an int >= 0, got {k!r}")
        if not isinstance(self.draft_gate, bool):
            raise ValueError(f"draft_gate: expected a bool, got {self.draft_gate!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (what a worker process is started with)."""
        return dataclasses.asdict(self)
