"""A decode batch's paged-attention tiles for the compiled tile kernel, planned from Python lists.

:func:`~deepinfer_kernels.plan_paged_attention` plans any batch (prefill chunks, windows,
verification rows) with about twenty torch ops; in a SmolLM2-135M decode step on a 2-core CPU
that was ~1.5 ms of a ~30 ms step. A decode batch (one query per sequence, causal, no window)
needs much less: one tile per sequence reading its first ``ceil(len / block_size)`` pages, and a
mask only when the lengths differ. :func:`plan_decode_tiles` builds exactly the tile batch the
general planner builds for such a batch (``test_cpu_decode_tiles.py`` checks it against
``plan_tile_batches``), checking the metadata the kernel would read out of bounds with.

Example::

    tiles = plan_decode_tiles([[3, 1]], [20], block_size=16, num_blocks=8, num_q_heads=9)
    bound.retarget(tiles)  # BoundTiles over every layer's caches
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# The general planner's budget (``attention/tile_plan.py``'s ``_SCORE_BUDGET`` and
# ``_SHORT_TILE``; not imported: its package imports this one): short tiles share one batch
# while ``tiles * span * num_q_heads * SHORT_TILE`` fp32 scores fit. A decode batch past it is
# split there, so it is left to that planner here. The test checks the two agree.
SCORE_BUDGET = 1 << 24
SHORT_TILE = 16


@dataclass(frozen=True)
class DecodeTiles:
    """One tile per sequence, each ``max_q`` queries (1 for decode) over ``key_len`` keys in
    ``num_pages`` pages: ``page_ids`` int64 ``[num_tiles * num_pages]`` (pages past a sequence's
    last one are block 0, masked), ``keep`` bool ``[num_tiles, max_q, key_len]`` or None when
    every key is kept (equal lengths, one query). The fields mean what ``TileBatch``'s do; ``num_blocks`` is the pool size every
    id was checked against."""

    page_ids: torch.Tensor
    keep: torch.Tensor | None
    num_tiles: int
    num_pages: int
    key_len: int
    num_blocks: int
    max_q: int = 1  # queries per tile (a verification tile: its causal mask is ``keep``)


def plan_decode_tiles(
    block_tables: Sequence[Sequence[int]],
    seq_lens: Sequence[int],
    *,
    block_size: int,
    num_blocks: int,
    num_q_heads: int,
) -> DecodeTiles | None:
    """The tile batch of a decode step whose sequence ``b`` attends with its last token over
    ``seq_lens[b]`` keys in the pages ``block_tables[b]``, or None when the general planner
    would cut it into several batches (a long context at a large batch).

    Raises ``ValueError`` naming the argument for an empty batch, a length below 1, a table
    too short for its length, or a page it reads outside ``[0, num_blocks)``.
    """
    if not seq_lens or len(block_tables) != len(seq_lens):
        raise ValueError(
            f"block_tables: expected one table per sequence of a non-empty batch, got "
            f"{len(block_tables)} for {len(seq_lens)} lengths"
        )
    key_len = max(seq_lens)
    if min(seq_lens) < 1:
        raise ValueError(f"seq_lens: expected every length >= 1, got {list(seq_lens)}")
    batch = len(seq_lens)
    if batch > 1 and batch * key_len * num_q_heads * SHORT_TILE > SCORE_BUDGET:
        return None
    num_pages = -(-key_len // block_size)
    pages: list[int] = []
    for b, (table, n) in enumerate(zip(block_tables, seq_lens)):
        used = -(-n // block_size)
        if len(table) < used:
            raise ValueError(
                f"block_tables[{b}]: {len(table)} blocks of {block_size} cannot hold "
                f"seq_lens[{b}]={n}"
            )
        row = list(table[:used])
        if min(row) < 0 or max(row) >= num_blocks:
            raise ValueError(f"block_tables[{b}]: a block id outside [0, {num_blocks}) is read")
        pages.extend(row)
        pages.extend([0] * (num_pages - used))
    keep = None
    if min(seq_lens) != key_len:
        lens = torch.tensor(list(seq_lens), dtype=torch.int64)
        keep = (torch.arange(key_len)[None, :] < lens[:, None]).reshape(batch, 1, key_len)
    ids = torch.tensor(pages, dtype=torch.int64)
    return DecodeTiles(ids, keep, batch, num_pages, key_len, num_blocks)


def plan_verify_tile(
    block_table: Sequence[int],
    seq_len: int,
    q_len: int,
    *,
    block_size: int,
    num_blocks: int,
    num_q_heads: int,
) -> DecodeTiles | None:
    """The one tile of a step whose only sequence appends its last ``q_len`` tokens (a
    speculative verification: the token and its drafts) and attends causally over ``seq_len``
    keys in the pages ``block_table``: query ``r`` keeps keys ``j < seq_len - q_len + 1 + r``.
    None when ``q_len`` is outside ``[1, SHORT_TILE]`` (the general planner's short tiles).
    Raises ``ValueError`` as :func:`plan_decode_tiles` does, and for ``q_len > seq_len``."""
    if not 1 <= q_len <= SHORT_TILE:
        return None
    if q_len > seq_len:
        raise ValueError(f"q_len: expected at most seq_len={seq_len}, got {q_len}")
    one = plan_decode_tiles(
        [block_table], [seq_len], block_size=block_size, num_blocks=num_blocks,
        num_q_heads=num_q_heads,
    )  # fmt: skip
    if one is None or q_len == 1:
        return one
    first = seq_len - q_len + 1  # keys the first query sees
    keep = torch.arange(seq_len)[None, :] < torch.arange(first, first + q_len)[:, None]
    return DecodeTiles(one.page_ids, keep.reshape(1, q_len, seq_len), 1, one.num_pages,
                       seq_len, num_blocks, q_len)  # fmt: skip
