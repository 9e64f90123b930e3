"""`StepInputs`: the tensors one forward over a flat ragged batch reads, built in one pass.

For sequence ``b`` feeding ``tokens[b]`` at positions ``starts[b] ..`` over its KV blocks
``block_tables[b]`` (block size ``S``):

* ``input_ids`` and ``positions``: the tokens and their positions, concatenated;
* ``slot_mapping[t] = block[p // S] * S + p % S`` for token ``t`` at position ``p``;
* ``seq_lens[b] = starts[b] + len(tokens[b])``, ``cu_seqlens_q`` their query-length prefix sums;
* ``block_table``: the block ids, each row padded with 0 to the longest (at least one column).

The paged-KV fields are ``AttentionMetadata.build``'s (one ``torch.tensor`` per field from
Python lists, no device copy when the target is the CPU); this module adds the ids and positions
and, for decode steps on the CPU, `DecodeInputBuffers` (for a step of one sequence's few
tokens, a speculative verification, `VerifyInputBuffers`). At batch 1 on the CPU the step's few
small torch calls run right after ~10 ms of kernels have evicted the interpreter's working set,
where each costs tens of microseconds rather than the few a warm loop measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer.models.attention_metadata import AttentionMetadata


@dataclass(frozen=True)
class StepInputs:
    """``input_ids`` and ``positions`` (int64 ``[T]``) and their paged-KV addressing."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def build_step_inputs(
    block_tables: Sequence[Sequence[int]],
    starts: Sequence[int],
    tokens: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> StepInputs:
    """The step's tensors (see the module doc); ``ValueError`` names the argument that is
    inconsistent (lengths that differ, an empty token list, too few blocks)."""
    if not len(block_tables) == len(starts) == len(tokens):
        raise ValueError(
            f"block_tables, starts and tokens must have the same length, got "
            f"{len(block_tables)}, {len(starts)} and {len(tokens)}"
        )
    ids: list[int] = []
    positions: list[int] = []
    seq_lens: list[int] = []
    query_lens: list[int] = []
    for b, (start, toks) in enumerate(zip(starts, tokens)):
        count = len(toks)
        if count < 1 or start < 0:
            raise ValueError(f"tokens[{b}] must be non-empty at starts[{b}] >= 0, got {start}")
        ids.extend(toks)
        if count == 1:  # a decode token: no range object
            positions.append(start)
        else:
            positions.extend(range(start, start + count))
        seq_lens.append(start + count)
        query_lens.append(count)
    # AttentionMetadata.build checks block_size and that each sequence's blocks cover its
    # positions.
    attn = AttentionMetadata.build(block_tables, seq_lens, query_lens, block_size, device=device)
    target = attn.seq_lens.device
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=target),
        positions=torch.tensor(positions, dtype=torch.int64, device=target),
        attn=attn,
    )


class DecodeInputBuffers:
    """`StepInputs` of decode steps (one token per sequence) on the CPU, kept between steps.

    A decode step writes its values into numpy views of tensors made for the batch's shape
    (sequences x block-table width) and hands back the same `StepInputs` object, so a step
    makes no tensor and re-validates no metadata; a new shape (another batch size, a block
    table grown by a block every ``block_size`` tokens) makes new ones. The values follow the
    module doc's formulas, exactly as ``build_step_inputs`` computes them.

    The tensors are overwritten by the next decode step: a caller keeps nothing from one step
    to the next (the model reads them during its forward only).
    """

    def __init__(self) -> None:
        self._shape: tuple[int, int] | None = None
        self._inputs: StepInputs | None = None
        self._ids = self._positions = self._slots = self._seq_lens = np.zeros(0, dtype=np.int64)
        self._table = np.zeros((0, 1), dtype=np.int32)

    def fill(
        self,
        block_tables: Sequence[Sequence[int]],
        starts: Sequence[int],
        tokens: Sequence[Sequence[int]],
        block_size: int,
    ) -> StepInputs:
        """This decode step's inputs (``tokens[b]`` holds exactly one token). ``ValueError``
        names the argument that is inconsistent."""
        rows = len(tokens)
        if not rows == len(block_tables) == len(starts):
            raise ValueError(
                f"block_tables, starts and tokens must have the same length, got "
                f"{len(block_tables)}, {len(starts)} and {rows}"
            )
        if rows == 0 or block_size <= 0:
            raise ValueError(f"a decode step needs sequences and a positive block_size, got "
                             f"{rows} sequences and block_size {block_size}")  # fmt: skip
        width = max(1, max(len(blocks) for blocks in block_tables))
        inputs = self._inputs
        if inputs is None or self._shape != (rows, width):
            inputs = self._allocate(rows, width)
        ids, positions, slots = self._ids, self._positions, self._slots
        seq_lens, table = self._seq_lens, self._table
        for b, (blocks, start, toks) in enumerate(zip(block_tables, starts, tokens)):
            if len(toks) != 1:
                raise ValueError(f"tokens[{b}]: a decode step feeds one token, got {len(toks)}")
            if start < 0 or len(blocks) * block_size <= start:
                raise ValueError(
                    f"block_tables[{b}] has {len(blocks)} blocks of {block_size}: too few for "
                    f"position starts[{b}]={start}"
                )
            ids[b] = toks[0]
            positions[b] = start
            slots[b] = blocks[start // block_size] * block_size + start % block_size
            seq_lens[b] = start + 1
            count = len(blocks)
            table[b, :count] = blocks
            if count < width:
                table[b, count:] = 0
        return inputs

    def _allocate(self, rows: int, width: int) -> StepInputs:
        self._ids = np.zeros(rows, dtype=np.int64)
        self._positions = np.zeros(rows, dtype=np.int64)
        self._slots = np.zeros(rows, dtype=np.int64)
        self._seq_lens = np.zeros(rows, dtype=np.int32)
        self._table = np.zeros((rows, width), dtype=np.int32)
        cu = np.arange(rows + 1, dtype=np.int32)
        self._inputs = _numpy_views(
            self._ids, self._positions, self._table, self._seq_lens, cu, self._slots
        )
        self._shape = (rows, width)
        return self._inputs


# The most tokens a step of one sequence may feed through `VerifyInputBuffers`: a speculative
# verification is the anchor and a few drafts; longer steps (a prefill chunk) build theirs.
MAX_VERIFY_TOKENS = 16


class VerifyInputBuffers:
    """`StepInputs` of steps of ONE sequence feeding a few tokens on the CPU (a speculative
    verification: the anchor and its drafts), kept between steps as `DecodeInputBuffers` keeps
    a decode step's: values written into numpy views of tensors made for the step's shape
    (tokens x block-table width), the same `StepInputs` object handed back while the shape
    holds. The values are ``build_step_inputs``'s; the tensors are overwritten by the next
    step, so a caller keeps nothing from one step to the next.
    """

    def __init__(self) -> None:
        self._shape: tuple[int, int] | None = None
        self._inputs: StepInputs | None = None
        self._ids = self._positions = self._slots = np.zeros(0, dtype=np.int64)
        self._seq_lens = np.zeros(1, dtype=np.int32)
        self._table = np.zeros((1, 1), dtype=np.int32)

    @staticmethod
    def takes(tokens: Sequence[Sequence[int]]) -> bool:
        """Whether a step feeding ``tokens`` (one list per sequence) is one these buffers
        fill: one sequence of 1 to :data:`MAX_VERIFY_TOKENS` tokens."""
        return len(tokens) == 1 and 1 <= len(tokens[0]) <= MAX_VERIFY_TOKENS

    def fill(
        self,
        block_tables: Sequence[Sequence[int]],
        starts: Sequence[int],
        tokens: Sequence[Sequence[int]],
        block_size: int,
    ) -> StepInputs:
        """This step's inputs (one sequence: ``tokens[0]`` at positions ``starts[0] ..``).
        ``ValueError`` names the argument that is inconsistent."""
        if not len(tokens) == len(block_tables) == len(starts) == 1:
            raise ValueError(
                f"block_tables, starts and tokens must each hold one sequence, got "
                f"{len(block_tables)}, {len(starts)} and {len(tokens)}"
            )
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        blocks, start, toks = block_tables[0], starts[0], tokens[0]
        count = len(toks)
        if not 1 <= count <= MAX_VERIFY_TOKENS:
            raise ValueError(f"tokens[0]: expected 1 to {MAX_VERIFY_TOKENS} tokens, got {count}")
        end = start + count
        if start < 0 or len(blocks) * block_size < end:
            raise ValueError(
                f"block_tables[0] has {len(blocks)} blocks of {block_size}: too few for "
                f"positions starts[0]={start} .. {end - 1}"
            )
        width = len(blocks)  # at least one: the check above
        inputs = self._inputs
        if inputs is None or self._shape != (count, width):
            inputs = self._allocate(count, width)
        self._ids[:] = toks
        self._positions[:] = range(start, end)
        self._slots[:] = [blocks[p // block_size] * block_size + p % block_size
                          for p in range(start, end)]  # fmt: skip
        self._seq_lens[0] = end
        self._table[0] = blocks
        return inputs

    def _allocate(self, count: int, width: int) -> StepInputs:
        self._ids = np.zeros(count, dtype=np.int64)
        self._positions = np.zeros(count, dtype=np.int64)
        self._slots = np.zeros(count, dtype=np.int64)
        self._seq_lens = np.zeros(1, dtype=np.int32)
        # One row exactly as wide as the sequence's table: nothing to pad.
        self._table = np.zeros((1, width), dtype=np.int32)
        cu = np.array([0, count], dtype=np.int32)
        self._inputs = _numpy_views(
            self._ids, self._positions, self._table, self._seq_lens, cu, self._slots
        )
        self._shape = (count, width)
        return self._inputs


def _numpy_views(
    ids: np.ndarray,
    positions: np.ndarray,
    table: np.ndarray,
    seq_lens: np.ndarray,
    cu_seqlens_q: np.ndarray,
    slots: np.ndarray,
) -> StepInputs:
    """`StepInputs` whose tensors share memory with these arrays (kept between steps by the
    buffers above, which write the next step's values into the arrays)."""
    return StepInputs(
        input_ids=torch.from_numpy(ids),
        positions=torch.from_numpy(positions),
        attn=AttentionMetadata(
            block_table=torch.from_numpy(table),
            seq_lens=torch.from_numpy(seq_lens),
            cu_seqlens_q=torch.from_numpy(cu_seqlens_q),
            slot_mapping=torch.from_numpy(slots),
        ),
    )
