"""``plan_decode_tiles`` plans a decode batch exactly as the general planner does, and a bound
tile runner re-pointed at it (``BoundTiles.retarget``) attends as ``PagedAttentionPlan.run``."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.attention import tile_plan, torch_path
from deepinfer_kernels.cpu import BoundTiles, PagedAttentionTiles, compiler_available
from deepinfer_kernels.cpu.decode_tiles import (
    SCORE_BUDGET,
    SHORT_TILE,
    DecodeTiles,
    plan_decode_tiles,
    plan_verify_tile,
)


@pytest.fixture(scope="module")
def tiles(tmp_path_factory: pytest.TempPathFactory) -> PagedAttentionTiles:
    if not compiler_available():
        pytest.skip("no C compiler on this machine")
    k = PagedAttentionTiles(tmp_path_factory.mktemp("kernels"), enabled=True)
    assert k.available(), k.fn.error  # a machine with a compiler must build it
    return k


def test_budget_is_the_general_planners() -> None:
    assert (SCORE_BUDGET, SHORT_TILE) == (tile_plan._SCORE_BUDGET, tile_plan._SHORT_TILE)


def _batch(
    seed: int, lens: list[int], block_size: int, spare: int
) -> tuple[list[list[int]], int, torch.Tensor]:
    """Shuffled block tables for ``lens`` (each with ``spare`` extra blocks) over one pool, the
    pool's size, and the int32 table the general planner takes (unused columns hold garbage)."""
    rng = random.Random(seed)
    need = [-(-n // block_size) + spare for n in lens]
    num_blocks = sum(need) + 3
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    tables, at = [], 0
    for n in need:
        tables.append(ids[at : at + n])
        at += n
    width = max(need)
    table = torch.full((len(lens), width), 7, dtype=torch.int32)  # 7: garbage past the end
    for b, t in enumerate(tables):
        table[b, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return tables, num_blocks, table


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 4, 16]),
    heads=st.sampled_from([(1, 1), (4, 2), (9, 3)]),
    spare=st.integers(0, 2),
    seed=st.integers(0, 100),
)
def test_equals_the_general_planners_tile_batch(
    lens: list[int], block_size: int, heads: tuple[int, int], spare: int, seed: int
) -> None:
    tables, num_blocks, table = _batch(seed, lens, block_size, spare)
    got = plan_decode_tiles(
        tables, lens, block_size=block_size, num_blocks=num_blocks, num_q_heads=heads[0]
    )
    want = torch_path.plan_tile_batches(
        table, lens, list(range(len(lens) + 1)), block_size=block_size, num_q_heads=heads[0],
        num_kv_heads=heads[1], causal=True, window=0,
    )  # fmt: skip
    assert got is not None and len(want) == 1
    tb = want[0]
    assert (got.num_tiles, got.num_pages, got.key_len) == (tb.num_tiles, tb.num_pages, tb.key_len)
    assert tb.max_q == 1 and got.num_blocks == num_blocks
    assert torch.equal(got.page_ids, tb.page_ids)
    if tb.keep is None:
        assert got.keep is None
    else:
        assert got.keep is not None and torch.equal(got.keep, tb.keep)


def test_a_batch_the_general_planner_splits_is_left_to_it() -> None:
    lens, heads = [20000] * 8, 16
    tables, num_blocks, table = _batch(0, lens, 16, 0)
    want = torch_path.plan_tile_batches(
        table, lens, list(range(9)), block_size=16, num_q_heads=heads, num_kv_heads=4,
        causal=True, window=0,
    )  # fmt: skip
    assert len(want) > 1
    assert plan_decode_tiles(tables, lens, block_size=16, num_blocks=num_blocks,
                             num_q_heads=heads) is None  # fmt: skip
    # One sequence is never split.
    assert plan_decode_tiles(tables[:1], lens[:1], block_size=16, num_blocks=num_blocks,
                             num_q_heads=heads) is not None  # fmt: skip


def test_bad_metadata_is_refused_by_name() -> None:
    kw = {"block_size": 4, "num_blocks": 3, "num_q_heads": 2}
    with pytest.raises(ValueError, match="block_tables"):
        plan_decode_tiles([], [], **kw)
    with pytest.raises(ValueError, match="seq_lens"):
        plan_decode_tiles([[0]], [0], **kw)
    with pytest.raises(ValueError, match=r"block_tables\[0\]: 1 blocks"):
        plan_decode_tiles([[0]], [5], **kw)
    with pytest.raises(ValueError, match=r"block_tables\[1\]: a block id outside"):
        plan_decode_tiles([[0], [1, 3]], [1, 5], **kw)
    with pytest.raises(ValueError, match="outside"):
        plan_decode_tiles([[-1]], [1], **kw)


@settings(max_examples=15, deadline=None)
@given(
    steps=st.lists(st.lists(st.integers(1, 40), min_size=3, max_size=3), min_size=1, max_size=3),
    block_size=st.sampled_from([4, 16]),
    seed=st.integers(0, 100),
)
def test_retargeted_runner_attends_as_the_plan(
    tiles: PagedAttentionTiles, steps: list[list[int]], block_size: int, seed: int
) -> None:
    """One runner bound for 3 rows over two layers, re-pointed at several decode steps, writes
    exactly what each step's plan returns."""
    hq, hkv, d, rows = 4, 2, 32, 3
    g = torch.Generator().manual_seed(seed)
    pool = 3 * (-(-40 // block_size)) + 3
    layers = [
        (torch.randn(pool, block_size, hkv, d, generator=g),
         torch.randn(pool, block_size, hkv, d, generator=g))
        for _ in range(2)
    ]  # fmt: skip
    q, out = torch.empty(rows, hq, d), torch.empty(rows, hq, d)
    first = plan_decode_tiles([[0]] * rows, [1] * rows, block_size=block_size, num_blocks=pool,
                              num_q_heads=hq)  # fmt: skip
    assert first is not None
    bound = BoundTiles(
        tiles, q, [k for k, _ in layers], [v for _, v in layers], out, page_ids=first.page_ids,
        keep=first.keep, num_tiles=rows, max_q=1, num_pages=first.num_pages,
        key_len=first.key_len, scale=d**-0.5, soft_cap=0.0,
    )  # fmt: skip
    for i, lens in enumerate(steps):
        tables, _, table = _batch(seed + i, lens, block_size, 0)
        decode = plan_decode_tiles(tables, lens, block_size=block_size, num_blocks=pool,
                                   num_q_heads=hq)  # fmt: skip
        assert decode is not None
        bound.retarget(decode)
        plan = dk.plan_paged_attention(
            table, torch.tensor(lens, dtype=torch.int32),
            torch.arange(rows + 1, dtype=torch.int32), block_size=block_size, num_q_heads=hq,
            num_kv_heads=hkv, head_dim=d, scale=d**-0.5, cpu_kernel=tiles,
        )  # fmt: skip
        with torch.inference_mode():
            for layer, (k, v) in enumerate(layers):
                q.normal_(generator=g)
                bound(layer)
                assert torch.equal(out, plan.run(q, k, v))


def test_retarget_refuses_tiles_of_another_batch(tiles: PagedAttentionTiles) -> None:
    k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8)
    q, out = torch.randn(1, 2, 8), torch.empty(1, 2, 8)
    pages = torch.zeros(1, dtype=torch.int64)
    bound = BoundTiles(tiles, q, [k], [v], out, page_ids=pages, keep=None, num_tiles=1, max_q=1,
                       num_pages=1, key_len=1, scale=1.0, soft_cap=0.0)  # fmt: skip
    two = plan_decode_tiles([[0], [1]], [1, 1], block_size=4, num_blocks=2, num_q_heads=2)
    assert two is not None
    with pytest.raises(ValueError, match="tiles: expected 1 tiles of 1 queries"):
        bound.retarget(two)
    verify = plan_verify_tile([0], 3, 2, block_size=4, num_blocks=2, num_q_heads=2)
    assert verify is not None and verify.max_q == 2
    with pytest.raises(ValueError, match="tiles: expected 1 tiles of 1 queries"):
        bound.retarget(verify)  # a verification tile needs a runner bound for its queries
    bigger = DecodeTiles(pages, None, 1, 1, 1, num_blocks=3)
    with pytest.raises(ValueError, match="checked against 3 blocks"):
        bound.retarget(bigger)
    with pytest.raises(ValueError, match="page_ids"):
        bound.retarget(DecodeTiles(pages.int(), None, 1, 1, 1, num_blocks=2))


@settings(max_examples=25, deadline=None)
@given(
    q_len=st.integers(1, 6),
    seq_len=st.integers(1, 70),
    block_size=st.sampled_from([1, 4, 16]),
    group=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**16),
)
def test_a_bound_verification_tile_attends_as_the_general_plan(
    tiles: PagedAttentionTiles, q_len: int, seq_len: int, block_size: int, group: int, seed: int
) -> None:
    """One sequence's last ``q_len`` tokens through a runner bound with ``max_q=q_len`` and
    re-pointed at :func:`plan_verify_tile`'s tile: the same output as the general plan (causal
    mask per query, pages in any order)."""
    q_len = min(q_len, seq_len)
    used = -(-seq_len // block_size)
    num_blocks = used + 2
    table = random.Random(seed).sample(range(num_blocks), used)
    g = torch.Generator().manual_seed(seed)
    hkv, d = 1, 16
    k = torch.randn(num_blocks, block_size, hkv, d, generator=g)
    v = torch.randn(num_blocks, block_size, hkv, d, generator=g)
    q = torch.randn(q_len, hkv * group, d, generator=g)
    plan = dk.plan_paged_attention(
        torch.tensor([table], dtype=torch.int32), torch.tensor([seq_len], dtype=torch.int32),
        torch.tensor([0, q_len], dtype=torch.int32), block_size=block_size,
        num_q_heads=hkv * group, num_kv_heads=hkv, head_dim=d, scale=d**-0.5, cpu_kernel=tiles,
    )  # fmt: skip
    tile = plan_verify_tile(table, seq_len, q_len, block_size=block_size,
                            num_blocks=num_blocks, num_q_heads=hkv * group)  # fmt: skip
    assert tile is not None and tile.max_q == q_len
    first = plan_verify_tile([0], 1, 1, block_size=block_size, num_blocks=num_blocks,
                             num_q_heads=hkv * group)  # fmt: skip
    assert first is not None
    out = torch.empty(q_len, hkv * group, d)
    bound = BoundTiles(tiles, q, [k], [v], out, page_ids=first.page_ids, keep=None, num_tiles=1,
                       max_q=q_len, num_pages=1, key_len=1, scale=d**-0.5, soft_cap=0.0)  # fmt: skip
    bound.retarget(tile)
    with torch.inference_mode():
        bound(0)
        want = plan.run(q, k, v)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
