"""CPU benchmark: the torch path of ``paged_attention`` against a naive gather + SDPA baseline.

Decode, batch 8, 4k context, GQA 4 (32 query heads over 8 KV heads), head_dim 128, block 16,
fp32, shuffled block tables. Run::

    .venv/bin/pytest benchmarks/bench_kernels_attention.py --benchmark-only

The ratio (naive baseline time / ours) is the figure of merit; it is printed by the last
test and must be >= 1 (ours not slower). A stronger batched gather + GQA SDPA baseline, which
only works for this uniform batch, is measured too for context.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deepinfer_kernels

BATCH, CONTEXT, HQ, HKV, D, BS = 8, 4096, 32, 8, 128, 16


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    per_seq = CONTEXT // BS
    num_blocks = BATCH * per_seq + 7
    k_cache = torch.randn(num_blocks, BS, HKV, D, generator=g)
    v_cache = torch.randn(num_blocks, BS, HKV, D, generator=g)
    table = torch.randperm(num_blocks, generator=g)[: BATCH * per_seq].view(BATCH, per_seq)
    return {
        "q": torch.randn(BATCH, HQ, D, generator=g),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_table": table.to(torch.int32),
        "seq_lens": torch.full((BATCH,), CONTEXT, dtype=torch.int32),
        "cu_seqlens_q": torch.arange(BATCH + 1, dtype=torch.int32),
    }


def naive_gather_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
) -> torch.Tensor:
    """Per sequence: gather its pages, expand the KV heads, call SDPA."""
    outs = []
    cu = cu_seqlens_q.tolist()
    group = q.shape[1] // k_cache.shape[2]
    for b, n in enumerate(seq_lens.tolist()):
        nblk = -(-n // k_cache.shape[1])
        idx = block_table[b, :nblk].long()
        k = k_cache[idx].flatten(0, 1)[:n].repeat_interleave(group, dim=1)
        v = v_cache[idx].flatten(0, 1)[:n].repeat_interleave(group, dim=1)
        qb = q[cu[b] : cu[b + 1]]
        o = F.scaled_dot_product_attention(qb.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def batched_gather_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
) -> torch.Tensor:
    """A stronger baseline valid only for this uniform decode batch (all lengths equal, one
    query each): one gather for the whole batch and one GQA-aware SDPA call."""
    batch, hq, d = q.shape
    k = k_cache[block_table.long()].flatten(1, 2).transpose(1, 2)
    v = v_cache[block_table.long()].flatten(1, 2).transpose(1, 2)
    out = F.scaled_dot_product_attention(q.view(batch, hq, 1, d), k, v, enable_gqa=True)
    return out.view(batch, hq, d)


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    return _inputs()


_TIMES: dict[str, float] = {}


def test_decode_naive_gather_sdpa(benchmark, inputs):  # type: ignore[no-untyped-def]
    out = benchmark(naive_gather_sdpa, **inputs)
    _TIMES["baseline"] = benchmark.stats.stats.median
    assert out.shape == inputs["q"].shape


def test_decode_batched_gather_sdpa(benchmark, inputs):  # type: ignore[no-untyped-def]
    out = benchmark(batched_gather_sdpa, **inputs)
    _TIMES["batched"] = benchmark.stats.stats.median
    torch.testing.assert_close(out, naive_gather_sdpa(**inputs), atol=1e-4, rtol=1e-4)


def test_decode_paged_attention_cpu(benchmark, inputs):  # type: ignore[no-untyped-def]
    out = benchmark(deepinfer_kernels.paged_attention, **inputs, use_triton=False)
    _TIMES["ours"] = benchmark.stats.stats.median
    expected = naive_gather_sdpa(**inputs)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    if "baseline" in _TIMES:
        ratio = _TIMES["baseline"] / _TIMES["ours"]
        print(f"\npaged_attention CPU decode speed-up over naive gather + SDPA: {ratio:.2f}x")
    if "batched" in _TIMES:
        ratio = _TIMES["batched"] / _TIMES["ours"]
        print(f"paged_attention CPU decode speed-up over batched gather + SDPA: {ratio:.2f}x")


# --- Per-call overhead: one decode attention call of SmolLM2-135M (the model runner's case) --
# Batch 1, 9 query heads / 3 KV heads, head_dim 64, block 16, 140 keys: the maths is tiny, so
# the cost is the planning (tiles, page ids, mask) and dispatch around it. A model plans once
# per forward (``plan_paged_attention``) and calls ``plan.run`` in each of its 30 layers.
#
#     .venv/bin/pytest benchmarks/bench_kernels_attention.py --benchmark-only -s -k small

S_BATCH, S_CONTEXT, S_HQ, S_HKV, S_D = 1, 140, 9, 3, 64


@pytest.fixture(scope="module")
def small_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    per_seq = -(-S_CONTEXT // BS)
    num_blocks = S_BATCH * per_seq + 5
    table = torch.randperm(num_blocks, generator=g)[: S_BATCH * per_seq].view(S_BATCH, per_seq)
    return {
        "q": torch.randn(S_BATCH, S_HQ, S_D, generator=g),
        "k_cache": torch.randn(num_blocks, BS, S_HKV, S_D, generator=g),
        "v_cache": torch.randn(num_blocks, BS, S_HKV, S_D, generator=g),
        "block_table": table.to(torch.int32),
        "seq_lens": torch.full((S_BATCH,), S_CONTEXT, dtype=torch.int32),
        "cu_seqlens_q": torch.arange(S_BATCH + 1, dtype=torch.int32),
    }


def _small_plan(inputs: dict[str, torch.Tensor]) -> deepinfer_kernels.PagedAttentionPlan:
    return deepinfer_kernels.plan_paged_attention(
        inputs["block_table"], inputs["seq_lens"], inputs["cu_seqlens_q"],
        block_size=BS, num_q_heads=S_HQ, num_kv_heads=S_HKV, head_dim=S_D,
    )  # fmt: skip


_SMALL: dict[str, float] = {}


def test_small_decode_dense_sdpa(benchmark, small_inputs):  # type: ignore[no-untyped-def]
    """Lower bound: SDPA over the same keys already gathered into dense tensors."""
    out = benchmark(batched_gather_sdpa, **small_inputs)
    _SMALL["dense"] = benchmark.stats.stats.median
    assert out.shape == small_inputs["q"].shape


def test_small_decode_public_op(benchmark, small_inputs):  # type: ignore[no-untyped-def]
    out = benchmark(
        deepinfer_kernels.paged_attention, **small_inputs, use_triton=False, check_values=False
    )
    _SMALL["op"] = benchmark.stats.stats.median
    torch.testing.assert_close(out, naive_gather_sdpa(**small_inputs), atol=1e-5, rtol=1e-5)


def test_small_decode_plan(benchmark, small_inputs):  # type: ignore[no-untyped-def]
    benchmark(_small_plan, small_inputs)
    _SMALL["plan"] = benchmark.stats.stats.median


def test_small_decode_plan_run(benchmark, small_inputs):  # type: ignore[no-untyped-def]
    plan = _small_plan(small_inputs)
    q, k, v = small_inputs["q"], small_inputs["k_cache"], small_inputs["v_cache"]
    out = benchmark(plan.run, q, k, v)
    _SMALL["run"] = benchmark.stats.stats.median
    torch.testing.assert_close(out, naive_gather_sdpa(**small_inputs), atol=1e-5, rtol=1e-5)
    if {"op", "plan", "dense"} <= _SMALL.keys():
        per_step_old = 30 * _SMALL["op"]
        per_step_new = _SMALL["plan"] + 30 * _SMALL["run"]
        print(
            f"\none decode call: op {_SMALL['op'] * 1e6:.0f} us, plan {_SMALL['plan'] * 1e6:.0f} us,"
            f" run {_SMALL['run'] * 1e6:.0f} us, dense SDPA {_SMALL['dense'] * 1e6:.0f} us"
            f"\n30 layers: op per layer {per_step_old * 1e3:.2f} ms, plan once + 30 runs "
            f"{per_step_new * 1e3:.2f} ms ({per_step_old / per_step_new:.1f}x less)"
        )


def test_small_write_kv(benchmark, small_inputs):  # type: ignore[no-untyped-def]
    """One decode token's K/V write with ``check_values=False`` (layers after the first)."""
    k_cache, v_cache = small_inputs["k_cache"], small_inputs["v_cache"]
    k = torch.randn(S_BATCH, S_HKV, S_D)
    slots = torch.arange(S_BATCH, dtype=torch.int64) * BS
    benchmark(deepinfer_kernels.write_kv, k, k, k_cache, v_cache, slots, check_values=False)
    assert torch.equal(k_cache.view(-1, S_HKV, S_D)[slots], k)


# --- CPU tile kernel: 16 decode rows of SmolLM2's shape, torch path vs compiled tiles ---------
# 16 sequences of 20-44 keys in shuffled pages (a decode step of 16 concurrent requests),
# 9 query heads / 3 KV heads, head_dim 64, block 16. The plan runs its batch of short tiles
# with gather + SDPA, or with ``deepinfer_kernels.cpu.PagedAttentionTiles`` (compiled on first
# use; skipped without a C compiler).
#
#     .venv/bin/pytest benchmarks/bench_kernels_attention.py --benchmark-only -s -k tiles

_TILES: dict[str, float] = {}


@pytest.fixture(scope="module")
def tile_case() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    batch, num_blocks = 16, 512
    return {
        "q": torch.randn(batch, S_HQ, S_D, generator=g),
        "k_cache": torch.randn(num_blocks, BS, S_HKV, S_D, generator=g),
        "v_cache": torch.randn(num_blocks, BS, S_HKV, S_D, generator=g),
        "block_table": torch.randperm(num_blocks, generator=g)[: batch * 3]
        .view(batch, 3)
        .to(torch.int32),
        "seq_lens": torch.randint(20, 45, (batch,), generator=g, dtype=torch.int32),
        "cu_seqlens_q": torch.arange(batch + 1, dtype=torch.int32),
    }


def _tile_plan(case: dict[str, torch.Tensor], cpu_kernel=None):  # type: ignore[no-untyped-def]
    return deepinfer_kernels.plan_paged_attention(
        case["block_table"], case["seq_lens"], case["cu_seqlens_q"],
        block_size=BS, num_q_heads=S_HQ, num_kv_heads=S_HKV, head_dim=S_D, cpu_kernel=cpu_kernel,
    )  # fmt: skip


def test_tiles_torch_path(benchmark, tile_case):  # type: ignore[no-untyped-def]
    plan = _tile_plan(tile_case)
    benchmark(plan.run, tile_case["q"], tile_case["k_cache"], tile_case["v_cache"])
    _TILES["torch"] = benchmark.stats.stats.median


def _bench_compiled(benchmark, case, times: dict[str, float], what: str) -> None:  # type: ignore[no-untyped-def]
    """Time the plan on the compiled tiles (checked against the torch path) and print the
    ratio to the torch path's time in ``times`` when that ran first."""
    from deepinfer_kernels.cpu import PagedAttentionTiles

    tiles = PagedAttentionTiles(enabled=True)
    if not tiles.available():
        pytest.skip(f"no compiled CPU kernel here: {tiles.fn.error}")
    plan = _tile_plan(case, tiles)
    q, k, v = case["q"], case["k_cache"], case["v_cache"]
    with torch.inference_mode():
        out = benchmark(plan.run, q, k, v)
        torch.testing.assert_close(out, _tile_plan(case).run(q, k, v), atol=1e-5, rtol=1e-5)
    times["compiled"] = benchmark.stats.stats.median
    if "torch" in times:
        print(
            f"\n{what}: torch path {times['torch'] * 1e6:.0f} us, compiled tiles "
            f"{times['compiled'] * 1e6:.0f} us ({times['torch'] / times['compiled']:.2f}x)"
        )


def test_tiles_compiled(benchmark, tile_case):  # type: ignore[no-untyped-def]
    _bench_compiled(benchmark, tile_case, _TILES, "16 decode rows")


# --- CPU tile kernel: one long decode row (a lone request deep into its context) ------------
# 1 sequence of 2048 keys in shuffled pages, SmolLM2's heads: fewer tiles than threads, so the
# compiled kernel splits the keys into spans (merged exactly) to use every thread.
#
#     .venv/bin/pytest benchmarks/bench_kernels_attention.py --benchmark-only -s -k long_decode

_LONG: dict[str, float] = {}


@pytest.fixture(scope="module")
def long_decode_case() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    pages = 2048 // BS
    return {
        "q": torch.randn(1, S_HQ, S_D, generator=g),
        "k_cache": torch.randn(4 * pages, BS, S_HKV, S_D, generator=g),
        "v_cache": torch.randn(4 * pages, BS, S_HKV, S_D, generator=g),
        "block_table": torch.randperm(4 * pages, generator=g)[:pages]
        .view(1, pages)
        .to(torch.int32),
        "seq_lens": torch.tensor([2048], dtype=torch.int32),
        "cu_seqlens_q": torch.tensor([0, 1], dtype=torch.int32),
    }


def test_long_decode_torch_path(benchmark, long_decode_case):  # type: ignore[no-untyped-def]
    plan = _tile_plan(long_decode_case)
    c = long_decode_case
    benchmark(plan.run, c["q"], c["k_cache"], c["v_cache"])
    _LONG["torch"] = benchmark.stats.stats.median


def test_long_decode_compiled(benchmark, long_decode_case):  # type: ignore[no-untyped-def]
    _bench_compiled(benchmark, long_decode_case, _LONG, "1 decode row over 2048 keys")
