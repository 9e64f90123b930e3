"""Fast torch path of paged attention for CPU (and any non-Triton device).

Same maths as :mod:`deepinfer_kernels.reference.attention`, organised for speed and split in
two halves (FlashInfer-style *plan* / *run*):

* :func:`plan_tile_batches` does everything that depends only on the batch metadata (block
  table, lengths, query offsets) and not on the layer: it cuts the work into *tiles* (a
  sequence's queries, or a chunk of a long prefill), pads the short tiles (decode,
  verification) to a common query length so they run as one batch, gathers the page ids each
  tile reads (window start to causal end), and builds the additive ``0 / -inf`` mask. A model
  plans once per forward and reuses the result in every layer.
* :func:`run_tile_batches` does the per-layer work: one ``index_select`` of the pages per
  batch, the attention itself and the write-back of the valid rows.

GQA is handled by viewing the query heads as ``[Hkv, group]`` so each KV head is read once for
its whole group (no ``repeat_interleave`` of K and V). Softmax is unnormalised:
``o = (exp(s - m) @ v) / l`` and ``lse = m + log(l)``, so the log-sum-exp comes for free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from deepinfer_kernels.attention.invalid_blocks import (
    has_unreadable_blocks,
    paged_attention_masked,
)
from deepinfer_kernels.cpu.attention import PagedAttentionTiles

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


# CPU flash-attention kernel that also returns the natural-log LSE in fp32 (fp32 accumulation
# for fp16/bf16 inputs, strided K/V accepted). Absent on some builds: then the manual path runs.
_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _manual_softmax(
    qt: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    scale: float,
    soft_cap: float,
    group: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qt [nb, Hkv, G*M, D]``, ``k, v [nb, Hkv, L, D]``, ``keep [nb, M, L]`` (``None`` = all)
    -> ``(o [nb, Hkv, G*M, D], lse [nb, Hkv, G*M] fp32)`` in explicit fp32 ops (soft-cap
    capable): unnormalised ``p = exp(s - m)``, then ``o = (p @ v) / l`` and ``lse = m + log(l)``
    with ``l = sum(p)``."""
    nb, hkv, gm, d = qt.shape
    m, n = gm // group, k.shape[2]
    f32 = torch.float32
    kf = k.to(dtype=f32, memory_format=torch.contiguous_format)
    vf = v.to(dtype=f32, memory_format=torch.contiguous_format)
    scores = torch.matmul(qt.float(), kf.transpose(-1, -2)).mul_(scale)
    if soft_cap > 0:
        scores = scores.div_(soft_cap).tanh_().mul_(soft_cap)
    scores = scores.view(nb, hkv, group, m, n)
    if keep is not None:
        scores.masked_fill_(~keep[:, None, None], float("-inf"))
    mx = scores.amax(dim=-1, keepdim=True)
    p = scores.sub_(mx).exp_()
    denom = p.sum(dim=-1, keepdim=True)
    o = torch.matmul(p.view(nb, hkv, group * m, n), vf).view(nb, hkv, group, m, d)
    o = o / denom
    row_lse = (mx + torch.log(denom)).view(nb, hkv, group * m)
    return o.view(nb, hkv, group * m, d).to(qt.dtype), row_lse


def _attend(
    tb: TileBatch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    soft_cap: float,
    want_lse: bool,
    cpu_kernel: PagedAttentionTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One tile batch -> ``(o [num_rows, Hq, D], lse [num_rows, Hq] or None)`` over the padded
    rows."""
    nb, max_q = tb.num_tiles, tb.max_q
    if (
        cpu_kernel is not None
        and cpu_kernel.applies(q, k_cache, v_cache, max_q)
        and cpu_kernel.available()
    ):
        return cpu_kernel.run(
            q,
            k_cache,
            v_cache,
            page_ids=tb.page_ids,
            q_rows=tb.q_rows,
            row_start=tb.row_start or 0,
            keep=tb.keep,
            num_tiles=nb,
            max_q=max_q,
            num_pages=tb.num_pages,
            key_len=tb.key_len,
            scale=scale,
            soft_cap=soft_cap,
            want_lse=want_lse,
        )
    _, block_size, hkv, d = k_cache.shape
    hq = q.shape[1]
    group = hq // hkv
    keys = tb.num_pages * block_size
    # [nb, Hkv, L, D] views of the gathered pages (no transpose copy).
    if tb.page_start is not None:
        # A slice of the pool; a view when the cache is dense in its block dims (a pool slab is).
        end = tb.page_start + nb * tb.num_pages
        k = k_cache[tb.page_start : end].reshape(nb, keys, hkv, d)
        v = v_cache[tb.page_start : end].reshape(nb, keys, hkv, d)
    else:
        k = k_cache.index_select(0, tb.page_ids).view(nb, keys, hkv, d)
        v = v_cache.index_select(0, tb.page_ids).view(nb, keys, hkv, d)
    if tb.key_len < keys:
        k, v = k[:, : tb.key_len], v[:, : tb.key_len]
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    if tb.row_start is not None:
        qs = q[tb.row_start : tb.row_start + tb.num_rows]
    else:
        assert tb.q_rows is not None
        qs = q.index_select(0, tb.q_rows)
    if tb.causal_from is not None and soft_cap <= 0 and _FUSED is not None:
        return _attend_causal(tb.causal_from, qs, k, v, scale, want_lse)
    # [nb, max_q, Hkv, G, D] -> [nb, Hkv, G * max_q, D]: the G heads of a KV head share it.
    qt = qs.view(nb, max_q, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(nb, hkv, -1, d)
    if soft_cap <= 0 and _FUSED is not None:
        o, row_lse = _FUSED(qt, k, v, attn_mask=tb.bias, scale=scale)
    else:
        o, row_lse = _manual_softmax(qt, k, v, tb.keep, scale, soft_cap, group)
    # [nb, Hkv, G, max_q, ...] back to [nb * max_q, Hq, ...].
    o = o.view(nb, hkv, group, max_q, d).permute(0, 3, 1, 2, 4).reshape(nb * max_q, hq, d)
    if not want_lse:
        return o, None
    row_lse = row_lse.view(nb, hkv, group, max_q).permute(0, 3, 1, 2).reshape(nb * max_q, hq)
    return o, row_lse


def _attend_causal(
    start: int,
    qs: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    want_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A lone tile whose row ``r`` keeps keys ``j <= start + r`` (see ``TileBatch``):
    ``qs [M, Hq, D]``, ``k, v [1, Hkv, start + M, D]``.

    The flash kernel's causal mode is top-left aligned, so the tile's own ``M`` keys run in it
    and the ``start`` keys before them (all kept) in a second, unmasked call; the two softmaxes
    merge exactly through their log-sum-exps. Its causal mode needs one KV head per query head:
    K and V are expanded (a copy of the tile's keys, small next to the scores it skips).
    """
    assert _FUSED is not None
    group = qs.shape[1] // k.shape[1]
    q4 = qs.transpose(0, 1)[None]  # [1, Hq, M, D]
    k4, v4 = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    o, lse = _FUSED(q4, k4[:, :, start:], v4[:, :, start:], is_causal=True, scale=scale)
    if start:
        o_pre, lse_pre = _FUSED(q4, k4[:, :, :start], v4[:, :, :start], scale=scale)
        top = torch.maximum(lse, lse_pre)
        w, w_pre = torch.exp(lse - top)[..., None], torch.exp(lse_pre - top)[..., None]
        o = (o.float() * w + o_pre.float() * w_pre) / (w + w_pre)
        lse = top + torch.log(w + w_pre)[..., 0]
    out = o[0].transpose(0, 1).to(qs.dtype)  # [M, Hq, D]
    return out, (lse[0].transpose(0, 1) if want_lse else None)


def run_tile_batches(
    batches: list[TileBatch],
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    soft_cap: float,
    want_lse: bool,
    cpu_kernel: PagedAttentionTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run planned tile batches over one layer's cache; ``soft_cap <= 0`` means off.
    ``cpu_kernel`` runs the short tiles when it applies (see :mod:`deepinfer_kernels.cpu`).

    Returns ``(out like q, lse [total_q, Hq] fp32 or None when not wanted)``.
    """
    total = q.shape[0]
    if len(batches) == 1 and batches[0].row_start == 0 and batches[0].num_rows == total:
        # One batch covering every row in order (a decode batch, a lone prefill): its output
        # is the answer, no scatter.
        o, lse = _attend(batches[0], q, k_cache, v_cache, scale, soft_cap, want_lse, cpu_kernel)
        return o.to(q.dtype), lse
    covered = sum(tb.num_rows if tb.valid is None else tb.valid.numel() for tb in batches)
    if covered < total:
        # Rows of key-less sequences belong to no tile: they answer o = 0, lse = -inf.
        out = torch.zeros_like(q)
        lse_out = torch.full(q.shape[:2], float("-inf"), device=q.device) if want_lse else None
    else:
        out = torch.empty_like(q)
        lse_out = (
            torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if want_lse else None
        )
    for tb in batches:
        o, lse = _attend(tb, q, k_cache, v_cache, scale, soft_cap, want_lse, cpu_kernel)
        o = o.to(out.dtype)
        if tb.row_start is not None:
            out[tb.row_start : tb.row_start + tb.num_rows] = o
            if lse_out is not None and lse is not None:
                lse_out[tb.row_start : tb.row_start + tb.num_rows] = lse
            continue
        assert tb.out_rows is not None
        if tb.valid is not None:
            o = o.index_select(0, tb.valid)
            lse = None if lse is None else lse.index_select(0, tb.valid)
        out.index_copy_(0, tb.out_rows, o)
        if lse_out is not None and lse is not None:
            lse_out.index_copy_(0, tb.out_rows, lse)
    return out, lse_out


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    window: int,
    soft_cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged attention for validated inputs (plan then run); ``window <= 0`` /
    ``soft_cap <= 0`` mean off. Returns ``(out like q, lse [total_q, Hq] fp32)``."""
    lens, cu = seq_lens.tolist(), cu_seqlens_q.tolist()
    num_blocks, block_size = k_cache.shape[:2]
    if has_unreadable_blocks(block_table, lens, num_blocks, block_size):
        # Only reachable with check_values=False: skip those keys as the Triton kernels do.
        return paged_attention_masked(
            q, k_cache, v_cache, block_table, lens, cu, scale, causal, window, soft_cap
        )
    batches = plan_tile_batches(
        block_table,
        lens,
        cu,
        block_size=k_cache.shape[1],
        num_q_heads=q.shape[1],
        num_kv_heads=k_cache.shape[2],
        causal=causal,
        window=window,
        soft_cap=soft_cap,
    )
    out, lse = run_tile_batches(batches, q, k_cache, v_cache, scale, soft_cap, want_lse=True)
    assert lse is not None
    return out, lse


def default_scale(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else scale
