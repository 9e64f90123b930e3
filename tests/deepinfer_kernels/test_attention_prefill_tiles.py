"""Several prompts' prefill tiles in one call of the compiled CPU kernel (#24 "16 concurrent"):
the plan batches tiles of 17..``MAX_BATCH_TILE_Q`` queries and the kernel computes each row's
kept keys only; the result must equal the reference in fp32 for prompts of different lengths,
cached prefixes, GQA ratios, odd head dims, block sizes and sliding windows."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.cpu import PagedAttentionTiles, compiler_available
from deepinfer_kernels.cpu.attention import MAX_BATCH_TILE_Q, MAX_TILE_Q
from deepinfer_kernels.reference import paged_attention_reference
from deepinfer_kernels.testing import assert_attention_close


class CountingTiles(PagedAttentionTiles):
    """Counts the kernel's calls and the largest tile batch it ran."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(cache_dir=cache_dir, enabled=True)
        self.calls = 0
        self.most_tiles = 0

    def run(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.calls += 1
        self.most_tiles = max(self.most_tiles, int(kwargs["num_tiles"]))
        return super().run(*args, **kwargs)


@pytest.fixture(scope="module")
def tiles(tmp_path_factory: pytest.TempPathFactory) -> CountingTiles:
    if not compiler_available():
        pytest.skip("no C compiler on this machine")
    k = CountingTiles(tmp_path_factory.mktemp("kernels"))
    assert k.available(), k.fn.error
    return k


def _batch(
    q_lens: list[int], prefixes: list[int], block_size: int, hq: int, hkv: int, d: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """Random q, caches and metadata: sequence i has ``prefixes[i]`` cached keys and
    ``q_lens[i]`` new queries; its pages are shuffled over the pool (not one run)."""
    g = torch.Generator().manual_seed(seed)
    lens = [p + m for p, m in zip(prefixes, q_lens)]
    pages = [-(-n // block_size) for n in lens]
    total = sum(pages) + 2
    order = torch.randperm(total, generator=g).tolist()
    width = max(pages)
    table, at = [], 0
    for n in pages:
        table.append(order[at : at + n] + [0] * (width - n))
        at += n
    k = torch.randn(total, block_size, hkv, d, generator=g)
    v = torch.randn(total, block_size, hkv, d, generator=g)
    q = torch.randn(sum(q_lens), hq, d, generator=g)
    bt = torch.tensor(table, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    cu = torch.tensor(list(itertools.accumulate(q_lens, initial=0)), dtype=torch.int32)
    return q, k, v, bt, seq_lens, cu


@settings(max_examples=25, deadline=None)
@given(
    q_lens=st.lists(st.integers(MAX_TILE_Q + 1, MAX_BATCH_TILE_Q), min_size=2, max_size=5),
    prefix=st.sampled_from([0, 0, 5, 33]),
    block_size=st.sampled_from([1, 4, 16]),
    heads=st.sampled_from([(4, 4), (9, 3), (8, 1)]),
    d=st.sampled_from([8, 20, 64]),
    window=st.sampled_from([None, None, 24]),
    seed=st.integers(0, 2**16),
)
def test_batched_prefill_tiles_match_the_reference(
    tiles: CountingTiles,
    q_lens: list[int],
    prefix: int,
    block_size: int,
    heads: tuple[int, int],
    d: int,
    window: int | None,
    seed: int,
) -> None:
    hq, hkv = heads
    prefixes = [prefix * (i % 2) for i in range(len(q_lens))]
    q, k, v, bt, lens, cu = _batch(q_lens, prefixes, block_size, hq, hkv, d, seed)
    kw: dict[str, Any] = {"block_size": block_size, "num_q_heads": hq, "num_kv_heads": hkv}
    before = tiles.calls
    with torch.inference_mode():
        plan = dk.plan_paged_attention(
            bt, lens, cu, **kw, head_dim=d, sliding_window=window, cpu_kernel=tiles
        )
        out, lse = plan.run(q, k, v, return_lse=True)
    ref, ref_lse = paged_attention_reference(
        q, k, v, bt, lens, cu, sliding_window=window, return_lse=True
    )
    assert_attention_close(out, ref)
    assert_attention_close(lse, ref_lse, dtype=torch.float32)
    # Tiles within 3/4 of the longest share a call: fewer calls than prompts when any do.
    longest = max(q_lens)
    sharing = sum(4 * m >= 3 * longest for m in q_lens)
    assert tiles.calls - before == plan.num_tile_batches
    if sharing >= 2:
        assert plan.num_tile_batches < len(q_lens)


def test_sixteen_prompts_run_as_one_call(tiles: CountingTiles) -> None:
    """The engine's 16-concurrent prefill shape (prompts of 76-77 tokens, SmolLM2's heads): one
    kernel call over all 16 prompts, equal to one SDPA per prompt (the plan without the kernel)
    and to the reference."""
    q_lens = [76 + (i % 3 == 0) for i in range(16)]
    q, k, v, bt, lens, cu = _batch(q_lens, [0] * 16, 16, 9, 3, 64, seed=7)
    kw: dict[str, Any] = {"block_size": 16, "num_q_heads": 9, "num_kv_heads": 3, "head_dim": 64}
    with torch.inference_mode():
        plan = dk.plan_paged_attention(bt, lens, cu, **kw, cpu_kernel=tiles)
        before, tiles.most_tiles = tiles.calls, 0
        out = plan.run(q, k, v)
        assert (tiles.calls - before, tiles.most_tiles) == (1, 16)
        per_prompt = dk.plan_paged_attention(bt, lens, cu, **kw)
        assert per_prompt.num_tile_batches == 16
        sdpa = per_prompt.run(q, k, v)
    assert_attention_close(out, sdpa)
    assert_attention_close(out, paged_attention_reference(q, k, v, bt, lens, cu))


def test_long_tiles_stay_on_sdpa(tiles: CountingTiles) -> None:
    """A prompt past ``MAX_BATCH_TILE_Q`` queries runs alone on SDPA, not on the kernel."""
    q_lens = [MAX_BATCH_TILE_Q + 1, MAX_BATCH_TILE_Q + 5]
    q, k, v, bt, lens, cu = _batch(q_lens, [0, 0], 16, 4, 2, 32, seed=1)
    kw: dict[str, Any] = {"block_size": 16, "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32}
    with torch.inference_mode():
        plan = dk.plan_paged_attention(bt, lens, cu, **kw, cpu_kernel=tiles)
        before = tiles.calls
        out = plan.run(q, k, v)
    assert tiles.calls == before
    assert plan.num_tile_batches == 2
    assert_attention_close(out, paged_attention_reference(q, k, v, bt, lens, cu))
