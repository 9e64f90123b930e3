"""What ``TieredKVStore.lookup`` and ``fetch`` return."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .hashing import BlockHash


@dataclass(frozen=True)
class LookupResult:
    """``num_blocks`` leading full blocks are cached; ``blocks_per_tier`` counts each matched
    block once, in the fastest tier holding it."""

    num_blocks: int
    num_tokens: int
    blocks_per_tier: dict[str, int]
    hashes: list[BlockHash] = field(repr=False)


@dataclass(frozen=True)
class FetchResult:
    """Pages ``[num_blocks, *page_shape]`` of the leading cached blocks, in order."""

    num_blocks: int
    num_tokens: int
    pages: list[torch.Tensor] = field(repr=False)
    source_tiers: dict[str, int]

    def stacked(self) -> torch.Tensor:
        return torch.stack(self.pages) if self.pages else torch.empty(0)
