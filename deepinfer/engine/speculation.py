"""The engine's seam to a speculator (``deepinfer.speculative.DSparkSpeculator`` in practice).

Per step the engine asks ``propose(batch)`` for drafts, runs ONE forward over every chunk with
its drafts appended, and hands the forward's outputs to ``accept(batch, drafts, outputs)``,
which returns the tokens each drafting sequence emits. The speculator never sees the engine: it
reads the batch (sequences, granted look-ahead slots) and the outputs (hidden states, captured
layers, a logits function), and keeps its own per-sequence state.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

import torch

from deepinfer.engine.chunk import StepBatch
from deepinfer.engine.sequence import Sequence


@dataclass
class Drafts:
    """A proposal for every chunk of a batch (row ``i`` is ``batch.chunks[i]``).

    ``bases[i] <= chunks[i].start``: the forward re-reads the sequence from there (positions
    whose features the speculator lacks); ``tokens[i]``: drafts to verify after the chunk, at
    most its ``max_drafts``. A speculator may subclass this to carry its step's state.
    """

    bases: list[int]
    tokens: list[list[int]]


@dataclass
class ForwardOutput:
    """One forward over a flat ragged batch.

    ``hidden [T, H]``: final hidden states; ``layers``: outputs of the layers asked for;
    ``offsets[i]``: first row of chunk ``i``; ``logits(rows)``: the LM head over those rows
    (an index tensor, or a slice of consecutive rows).
    """

    hidden: torch.Tensor
    layers: list[torch.Tensor]
    offsets: list[int]
    logits: Callable[[torch.Tensor | slice], torch.Tensor]


class Speculator(Protocol):
    """Drafts before a step's forward and verifies after it."""

    @property
    def layer_ids(self) -> Seq[int]:
        """Target layers whose outputs the forward must capture for the speculator."""
        ...

    def num_lookahead(self, seq: Sequence, max_model_len: int) -> int:
        """Draft slots worth reserving past ``seq``'s next token (asked of the batch policy)."""
        ...

    def propose(self, batch: StepBatch) -> Drafts: ...

    def accept(
        self, batch: StepBatch, drafts: Drafts, outputs: ForwardOutput
    ) -> list[list[int] | None]:
        """Per chunk: the tokens it emits (accepted drafts plus the correction or bonus), or
        ``None`` where it did not draft (the engine samples those rows itself)."""
        ...

    def release(self, seq_id: int) -> None:
        """Forget a finished or preempted sequence."""
        ...
