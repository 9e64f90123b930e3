"""The *plan* half of the torch path of paged attention (see ``torch_path.py``): everything
that depends only on the batch metadata (block table, lengths, query offsets), not on the layer.

The batch is cut into *tiles* (a sequence's queries, or a chunk of a long prefill); short tiles
(decode, verification) are padded to a common query length so they run as one batch; the page
ids each tile reads (window start to causal end) are gathered and the additive ``0 / -inf``
mask is built. A model plans once per forward and reuses the result in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_kernels.attention.cpu_flash import CPU_FLASH_ATTENTION as _FUSED

# A tile with more queries than this runs alone; shorter ones are batched together.
_SHORT_TILE = 16
# Upper bound on fp32 score elements materialised at once (64 MiB).
_SCORE_BUDGET = 1 << 24
# A lone tile with at least this many queries whose mask is "every key before it, causal over
# its own" (a prefill chunk, no window) runs the flash kernel's own causal mode instead of an
# additive mask: it skips the masked half instead of computing it (on the 2-core CPU, one
# SmolLM2 layer over 1024 tokens: 10.8 vs 15.0 ms; 2048: 34 vs 60 ms). Below this the additive
# mask was as fast or faster (128 queries: 0.3 vs 0.5 ms).
_CAUSAL_MIN_Q = 512
# With keys before the tile (a cached prefix, earlier chunks) the causal mode needs a second,
# unmasked call and a merge; that paid from about 1024 queries (1024 after 1024 keys: 26 vs
# 31 ms; 1500 after 1500: 53 vs 82 ms) and lost below (600 after 300: 9-14 vs 9-10 ms; 112
# after 1888: 14 vs 6 ms).
_CAUSAL_PREFIX_MIN_Q = 1024


def _causal_min_q(prefix: int) -> int:
    """Queries from which a tile after ``prefix`` earlier keys runs the flash causal mode."""
    return _CAUSAL_MIN_Q if prefix == 0 else _CAUSAL_PREFIX_MIN_Q


@dataclass(frozen=True)
class _Tile:
    seq: int
    row: int  # first query row in q
    n_q: int
    first_pos: int  # absolute position of the first query
    key_lo: int  # first key position it may read (block-aligned)
    key_hi: int  # one past the last key position it may read


@dataclass(frozen=True)
class TileBatch:
    """The layer-independent part of one batch of tiles.

    ``num_tiles`` tiles, each padded to ``max_q`` queries and reading ``num_pages`` pages of
    which the first ``key_len`` positions are used. ``page_ids`` (int64
    ``[num_tiles * num_pages]``) are the pages to gather; ``page_start`` is set when they are one
    run of consecutive ids (blocks allocated in order), which is read as a slice, no gather.
    Query rows: ``row_start`` when the
    padded rows are exactly ``q[row_start : row_start + num_tiles * max_q]`` (no gather, no
    scatter), else ``q_rows`` (int64, padded rows repeat a valid one) with ``valid`` (positions
    of the real rows among the padded ones, ``None`` = all) and ``out_rows`` (their rows in
    ``q``). ``bias`` (fp32 ``[num_tiles, 1, group * max_q, key_len]``, ``0`` kept / ``-inf``
    masked) and ``keep`` (bool ``[num_tiles, max_q, key_len]``) are ``None`` when every key of
    the span is kept by every row (decode batches of equal lengths, a lone decode).
    ``causal_from`` is set (and ``bias`` is ``None``, ``keep`` is not) for a lone long tile
    whose row ``r`` keeps exactly the keys ``j <= causal_from + r``: the first ``causal_from``
    keys (a cached prefix, earlier chunks) unmasked, its own ``max_q`` keys causal.
    """

    num_tiles: int
    max_q: int
    num_pages: int
    key_len: int
    page_ids: torch.Tensor
    page_start: int | None
    row_start: int | None
    q_rows: torch.Tensor | None
    valid: torch.Tensor | None
    out_rows: torch.Tensor | None
    bias: torch.Tensor | None
    keep: torch.Tensor | None
    causal_from: int | None = None

    @property
    def num_rows(self) -> int:
        return self.num_tiles * self.max_q


def _flash_causal_whole(m: int, n: int, causal: bool, window: int, soft_cap: float) -> bool:
    """Whether a sequence's ``m`` queries over ``n`` keys run as one tile in the flash kernel's
    causal mode (see ``TileBatch.causal_from``). That mode materialises no scores, so the score
    budget does not apply: cutting a 2048-token prefill into budget-sized chunks made the later
    chunks run with an additive mask over every earlier key, the masked half included (one
    SmolLM2 layer, one core: 0.17-0.19 s against 0.10-0.13 s as one causal tile)."""
    if not causal or window > 0 or soft_cap > 0 or _FUSED is None:
        return False
    return m >= _causal_min_q(n - m)


def _make_tiles(
    seq_lens: list[int],
    cu: list[int],
    causal: bool,
    window: int,
    block_size: int,
    group: int,
    num_kv_heads: int,
    soft_cap: float = 0.0,
) -> list[_Tile]:
    tiles = []
    for b, n in enumerate(seq_lens):
        m = cu[b + 1] - cu[b]
        if m == 0:
            continue
        chunk = m
        if m > _SHORT_TILE and not _flash_causal_whole(m, n, causal, window, soft_cap):
            per_query = max(1, group * num_kv_heads * n)
            chunk = max(_SHORT_TILE, min(m, _SCORE_BUDGET // per_query))
        for s in range(0, m, chunk):
            cnt = min(chunk, m - s)
            p0 = n - m + s
            hi = p0 + cnt if causal else n
            lo = max(0, p0 - window + 1) if window > 0 else 0
            lo -= lo % block_size
            if hi <= 0:
                # No key at all (a non-causal pass over an empty prefix): the rows are left
                # at o = 0, lse = -inf by run_tile_batches.
                continue
            tiles.append(_Tile(b, cu[b] + s, cnt, p0, lo, hi))
    return tiles


def _group_tiles(tiles: list[_Tile], num_q_heads: int, batch_q: int) -> list[list[_Tile]]:
    """Short tiles share batches as long as the padded scores fit the budget; tiles of up to
    ``batch_q`` queries share batches of their own (:func:`_group_medium_tiles`); longer tiles
    run alone."""
    groups: list[list[_Tile]] = []
    per_tile = num_q_heads * _SHORT_TILE
    batch: list[_Tile] = []
    batch_span = 0
    for t in tiles:
        if t.n_q > _SHORT_TILE:
            continue
        span = max(batch_span, t.key_hi - t.key_lo)
        if batch and (len(batch) + 1) * span * per_tile > _SCORE_BUDGET:
            groups.append(batch)
            batch, span = [], t.key_hi - t.key_lo
        batch.append(t)
        batch_span = span
    if batch:
        groups.append(batch)
    medium = [t for t in tiles if _SHORT_TILE < t.n_q <= batch_q]
    groups.extend(_group_medium_tiles(medium, num_q_heads))
    groups.extend([t] for t in tiles if t.n_q > max(batch_q, _SHORT_TILE))
    return groups


def _group_medium_tiles(tiles: list[_Tile], num_q_heads: int) -> list[list[_Tile]]:
    """Batches of prefill tiles for the compiled CPU kernel (several short prompts in one step):
    one call per layer instead of one SDPA per sequence. Longest first, a tile joins the batch
    while its queries are at least 3/4 of the batch's (padded rows repeat a valid one and are
    computed) and the batch's padded scores fit the budget."""
    groups: list[list[_Tile]] = []
    batch: list[_Tile] = []
    span = 0
    for t in sorted(tiles, key=lambda t: -t.n_q):
        width = max(span, t.key_hi - t.key_lo)
        if batch and (
            4 * t.n_q < 3 * batch[0].n_q
            or (len(batch) + 1) * width * num_q_heads * batch[0].n_q > _SCORE_BUDGET
        ):
            groups.append(batch)
            batch, width = [], t.key_hi - t.key_lo
        batch.append(t)
        span = width
    if batch:
        groups.append(batch)
    return groups


def _plan_batch(
    tiles: list[_Tile],
    block_table: torch.Tensor,
    seq_lens: list[int],
    block_size: int,
    group: int,
    causal: bool,
    window: int,
) -> TileBatch:
    device = block_table.device
    nb = len(tiles)
    max_q = max(t.n_q for t in tiles)
    span = max(t.key_hi - t.key_lo for t in tiles)
    n_blk = (span + block_size - 1) // block_size
    max_blocks = block_table.shape[1]

    def ints(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    seq_idx = ints([t.seq for t in tiles])
    key_lo = ints([t.key_lo for t in tiles])
    lens = ints([seq_lens[t.seq] for t in tiles])
    first_pos = ints([t.first_pos for t in tiles])
    n_q = ints([t.n_q for t in tiles])

    # Pages each tile reads; columns past the sequence's last block point at block 0 and are
    # masked out below (the table may hold garbage there).
    col = key_lo[:, None] // block_size + torch.arange(n_blk, device=device)[None, :]
    used = (lens + block_size - 1) // block_size
    blocks = torch.gather(block_table[seq_idx].long(), 1, col.clamp(max=max_blocks - 1))
    blocks = torch.where(col < used[:, None], blocks, torch.zeros_like(blocks)).reshape(-1)

    # Padded query rows repeat the tile's last valid row (same mask, never written back).
    t_idx = torch.arange(max_q, device=device)
    t_eff = torch.minimum(t_idx[None, :], n_q[:, None] - 1)
    key_pos = key_lo[:, None] + torch.arange(n_blk * block_size, device=device)[None, :]
    q_pos = first_pos[:, None] + t_eff
    keep = (key_pos < lens[:, None])[:, None, :]
    if causal:
        keep = keep & (key_pos[:, None, :] <= q_pos[:, :, None])
    if window > 0:
        keep = keep & (key_pos[:, None, :] > q_pos[:, :, None] - window)
    keep = keep.expand(nb, max_q, key_pos.shape[1])  # every row keeps at least its own key
    # Trailing key columns no row keeps are not read at all.
    kept_cols = keep.any(dim=1).any(dim=0).nonzero()
    key_len = int(kept_cols[-1]) + 1
    keep = keep[:, :, :key_len]
    bias = None
    keep_out: torch.Tensor | None = None
    causal_from: int | None = None
    masked = not bool(keep.all())
    start = key_len - max_q
    if masked and nb == 1 and start >= 0 and max_q >= _causal_min_q(start):
        causal_shape = torch.ones(max_q, key_len, dtype=torch.bool, device=device).tril(start)
        if torch.equal(keep[0], causal_shape):
            causal_from = start
    if masked:
        keep_out = keep.contiguous()
    if keep_out is not None and causal_from is None:
        # fp32 bias: the CPU flash kernel accepts it for fp16/bf16 queries too.
        b = torch.zeros(keep_out.shape, dtype=torch.float32, device=device)
        b.masked_fill_(~keep_out, float("-inf"))
        bias = b[:, None].expand(nb, group, max_q, key_len).reshape(nb, 1, group * max_q, key_len)

    n_ids = blocks.shape[0]
    run = torch.arange(n_ids, device=device) + blocks[0]
    page_start = int(blocks[0]) if bool((blocks == run).all()) else None
    rows0 = tiles[0].row
    all_valid = all(t.n_q == max_q for t in tiles)
    in_order = all(t.row == rows0 + i * max_q for i, t in enumerate(tiles))
    if all_valid and in_order:
        return TileBatch(
            nb, max_q, n_blk, key_len, blocks, page_start, rows0, None, None, None, bias,
            keep_out, causal_from,
        )  # fmt: skip
    rows = (ints([t.row for t in tiles])[:, None] + t_eff).reshape(-1)
    valid = None if all_valid else (t_idx[None, :] < n_q[:, None]).reshape(-1).nonzero()[:, 0]
    out_rows = rows if valid is None else rows[valid]
    return TileBatch(
        nb, max_q, n_blk, key_len, blocks, page_start, None, rows, valid, out_rows, bias,
        keep_out, causal_from,
    )  # fmt: skip


def plan_tile_batches(
    block_table: torch.Tensor,
    seq_lens: list[int],
    cu_seqlens_q: list[int],
    *,
    block_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    causal: bool,
    window: int,
    soft_cap: float = 0.0,
    batch_q: int = _SHORT_TILE,
) -> list[TileBatch]:
    """Cut a validated batch into tile batches and precompute their indices and masks.
    ``soft_cap > 0`` (scores materialised by the manual path) keeps every tile in the score
    budget. Tiles of up to ``batch_q`` queries are batched together (the compiled CPU kernel's
    prefill tiles, ``cpu.attention.MAX_BATCH_TILE_Q``); longer ones run alone on SDPA."""
    group = num_q_heads // num_kv_heads
    tiles = _make_tiles(
        seq_lens, cu_seqlens_q, causal, window, block_size, group, num_kv_heads, soft_cap
    )
    return [
        _plan_batch(g, block_table, seq_lens, block_size, group, causal, window)
        for g in _group_tiles(tiles, num_q_heads, batch_q)
    ]
