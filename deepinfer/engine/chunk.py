"""What one engine step runs: a `Chunk` per sequence, and the `Speculator` seam that may run
the step instead of the engine (``deepinfer.speculative.DSparkSpeculator``)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sequence import Sequence

if TYPE_CHECKING:
    from deepinfer.engine.engine import LLMEngine


@dataclass
class Chunk:
    """One sequence's slice of the flat batch: tokens ``start .. start + length``.

    ``max_drafts``: KV slots reserved past a decode token for speculative drafts.
    """

    seq: Sequence
    start: int
    length: int
    max_drafts: int = 0


class Speculator(Protocol):
    """Runs the engine's steps with speculative decodes (``deepinfer.speculative.DSparkSpeculator``)."""

    def num_draft_slots(self, seq: Sequence, max_model_len: int) -> int: ...

    def run(self, engine: LLMEngine, chunks: Seq[Chunk]) -> list[RequestOutput]: ...

    def release(self, seq_id: int) -> None: ...
