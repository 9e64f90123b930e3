"""`EngineConfig`: sizes and limits of one engine instance; `torch_dtype`: the weight dtypes a
``dtype`` argument may name. `SpeculativeConfig` (how it drafts) is `deepinfer_spec`'s."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# `SpeculativeConfig` lives in `deepinfer_spec` (with `load_speculator`); this path keeps working.
from deepinfer_spec import SpeculativeConfig

__all__ = ["DTYPES", "EngineConfig", "SpeculativeConfig", "torch_dtype"]

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
