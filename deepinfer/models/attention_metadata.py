"""`AttentionMetadata`: where each token of a flat ragged batch reads and writes paged KV."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Paged-KV addressing for one forward over a flat batch of ``T`` tokens from ``B`` sequences.

    Follows DESIGN.md's convention: sequence ``b`` owns query tokens
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``, which are the LAST ``q_len`` of its ``seq_lens[b]``
    KV positions; token ``t`` writes its K/V to slot ``slot_mapping[t]``
    (``block * block_size + offset``; ``-1`` skips the write).

    Attributes:
        block_table: int32 ``[B, max_blocks]`` physical block ids per sequence.
        seq_lens: int32 ``[B]`` KV length of each sequence including the new tokens.
        cu_seqlens_q: int32 ``[B + 1]`` prefix sums of the query lengths.
        slot_mapping: int64 ``[T]``.
    """

    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    slot_mapping: torch.Tensor

    def __post_init__(self) -> None:
        checks = (
            ("block_table", self.block_table, torch.int32, 2),
            ("seq_lens", self.seq_lens, torch.int32, 1),
            ("cu_seqlens_q", self.cu_seqlens_q, torch.int32, 1),
            ("slot_mapping", self.slot_mapping, torch.int64, 1),
        )
        for name, tensor, dtype, ndim in checks:
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.dtype != dtype or tensor.dim() != ndim:
                raise ValueError(
                    f"{name} must be {dtype} with {ndim} dims, got {tensor.dtype} {tuple(tensor.shape)}"
                )
        batch = self.seq_lens.shape[0]
        if self.block_table.shape[0] != batch or self.cu_seqlens_q.shape[0] != batch + 1:
            raise ValueError(
                f"block_table [B, *] and cu_seqlens_q [B+1] must agree with seq_lens [B={batch}], got "
                f"{tuple(self.block_table.shape)} and {tuple(self.cu_seqlens_q.shape)}"
            )

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    def to(self, device: torch.device | str) -> AttentionMetadata:
        return AttentionMetadata(
            block_table=self.block_table.to(device),
            seq_lens=self.seq_lens.to(device),
            cu_seqlens_q=self.cu_seqlens_q.to(device),
            slot_mapping=self.slot_mapping.to(device),
        )

    @classmethod
    def build(
        cls,
        block_tables: Sequence[Sequence[int]],
        seq_lens: Sequence[int],
        query_lens: Sequence[int],
        block_size: int,
        *,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Build the tensors from per-sequence Python lists.

        ``block_tables[b]`` must cover ``seq_lens[b]`` positions; sequence ``b``'s new tokens are
        positions ``seq_lens[b] - query_lens[b] .. seq_lens[b] - 1``.
        """
        if not len(block_tables) == len(seq_lens) == len(query_lens):
            raise ValueError("block_tables, seq_lens and query_lens must have the same length")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        width = max(1, max((len(t) for t in block_tables), default=0))
        table: list[list[int]] = []
        slots: list[int] = []
        cu = [0]
        for b, (blocks, seq_len, q_len) in enumerate(zip(block_tables, seq_lens, query_lens)):
            if not 0 < q_len <= seq_len:
                raise ValueError(
                    f"query_lens[{b}] must be in [1, seq_lens[{b}]={seq_len}], got {q_len}"
                )
            if len(blocks) * block_size < seq_len:
                raise ValueError(
                    f"block_tables[{b}] has {len(blocks)} blocks of {block_size}: too few for "
                    f"seq_lens[{b}]={seq_len}"
                )
            # Each row padded with 0 to the longest: the table is one torch.tensor call, not a
            # zero-filled tensor written row by row (a few small torch calls a sequence).
            table.append(list(blocks) + [0] * (width - len(blocks)))
            if q_len == 1:  # a decode token: no range object
                pos = seq_len - 1
                slots.append(blocks[pos // block_size] * block_size + pos % block_size)
            else:
                slots.extend(
                    blocks[p // block_size] * block_size + p % block_size
                    for p in range(seq_len - q_len, seq_len)
                )
            cu.append(cu[-1] + q_len)
        # None is torch.tensor's own default (the CPU): no device argument to resolve.
        target = None if str(device) == "cpu" else torch.device(device)
        return cls(
            block_table=torch.tensor(table, dtype=torch.int32, device=target)
            if table
            else torch.zeros((0, 1), dtype=torch.int32, device=target),
            seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=target),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=target),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=target),
        )

    def positions(self) -> torch.Tensor:
        """int64 ``[T]`` absolute positions of the query tokens (``seq_len - q_len + i``)."""
        q_lens = (self.cu_seqlens_q[1:] - self.cu_seqlens_q[:-1]).long()
        starts = self.seq_lens.long() - q_lens
        seq_of_token = torch.repeat_interleave(torch.arange(self.batch_size), q_lens.cpu()).to(
            q_lens.device
        )
        offset = torch.arange(self.num_tokens, device=q_lens.device) - self.cu_seqlens_q[
            :-1
        ].long().repeat_interleave(q_lens)
        return starts[seq_of_token] + offset
