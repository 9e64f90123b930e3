"""What one engine step runs: a `Chunk` per sequence, gathered in a `StepBatch`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.engine.sequence import Sequence


@dataclass
class Chunk:
    """One sequence's slice of the flat batch: tokens ``start .. start + length``.

    ``max_drafts``: look-ahead slots the batch policy granted past a decode token (KV is
    reserved for them); a speculator may verify up to that many drafts there.
    """

    seq: Sequence
    start: int
    length: int
    max_drafts: int = 0

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class StepBatch:
    """The scheduler's plan for one forward, and the engine's shared random generator
    (requests with their own ``seed`` carry their own)."""

    chunks: list[Chunk]
    generator: torch.Generator
