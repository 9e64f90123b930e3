"""The compiled CPU kernel for short paged-attention tiles, against the torch reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings

import deepinfer_kernels as dk
from deepinfer_kernels.cpu import PagedAttentionTiles, compiler_available
from deepinfer_kernels.cpu.attention import MAX_TILE_Q
from deepinfer_kernels.reference import paged_attention_reference
from deepinfer_kernels.testing import (
    PagedAttentionCase,
    assert_attention_close,
    paged_attention_cases,
)


class CountingTiles(PagedAttentionTiles):
    """Counts the tile batches the kernel ran, so a test can tell it was used."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(cache_dir=cache_dir, enabled=True)
        self.calls = 0

    def run(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.calls += 1
        return super().run(*args, **kwargs)


@pytest.fixture(scope="module")
def tiles(tmp_path_factory: pytest.TempPathFactory) -> CountingTiles:
    if not compiler_available():
        pytest.skip("no C compiler on this machine")
    k = CountingTiles(tmp_path_factory.mktemp("kernels"))
    assert k.available(), k.fn.error  # a machine with a compiler must build it
    return k


@settings(max_examples=60)
@given(
    case=paged_attention_cases(
        dtypes=(torch.float32,), allow_non_causal=True, kinds=("decode", "verify", "extend")
    )
)
def test_matches_the_reference(tiles: CountingTiles, case: PagedAttentionCase) -> None:
    """Decode, verification and short extend tiles (GQA ratios, odd head dims, block sizes 1
    to 64, sliding windows, soft-cap, non-causal) equal the reference in fp32, ``lse``
    included; longer tiles fall back to SDPA and still match."""
    ran = _run_and_compare(tiles, case)
    q_lens = (case.cu_seqlens_q[1:] - case.cu_seqlens_q[:-1]).tolist()
    if q_lens and max(q_lens) <= MAX_TILE_Q:
        assert ran  # every tile is short: the kernel ran


def _run_and_compare(tiles: CountingTiles, case: PagedAttentionCase) -> bool:
    """Run ``case`` on the plan with ``tiles``; ``o`` and ``lse`` must equal the reference.
    Returns whether the kernel ran."""
    before = tiles.calls
    with torch.inference_mode():
        out, lse = case.plan(use_triton=False, cpu_kernel=tiles).run(
            case.q, case.k_cache, case.v_cache, return_lse=True
        )
    ref_out, ref_lse = paged_attention_reference(*case.tensors(), **case.options(), return_lse=True)
    assert_attention_close(out, ref_out)
    assert_attention_close(lse, ref_lse, dtype=torch.float32)
    return tiles.calls > before


@settings(max_examples=25, deadline=None)
@given(
    case=paged_attention_cases(
        dtypes=(torch.float32,),
        allow_non_causal=True,
        kinds=("decode", "verify"),
        max_batch=2,
        max_seq_len=1500,
        # 20: the scalar loops (D not a multiple of 8); 24 and 72: the 8-key score blocks with
        # 16-lane dot tails and value sums of 3 and 8 + 1 register chunks.
        head_dims=(20, 24, 64, 72),
    )
)
def test_few_long_tiles_split_their_keys_and_match(
    tiles: CountingTiles, case: PagedAttentionCase
) -> None:
    """One or two tiles over up to 1500 keys: fewer tiles than twice the threads, so the kernel
    splits the keys into spans and merges their softmaxes; ``o`` and ``lse`` still equal the
    reference (sliding windows, soft-cap and masks included)."""
    assert _run_and_compare(tiles, case)


def test_long_context_decode_matches_the_torch_path(tiles: CountingTiles) -> None:
    """Sixteen decode rows over up to 2k keys each, pages in random order, ``q`` a strided
    view; the kernel runs on it."""
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 2048, (16,), generator=g, dtype=torch.int32)
    bt = torch.randperm(16 * 128, generator=g)[: 16 * 128].view(16, 128).to(torch.int32)
    k = torch.randn(16 * 128, 16, 2, 80, generator=g)
    v = torch.randn(16 * 128, 16, 2, 80, generator=g)
    # q as a model passes it: the first heads of a fused QKV projection (rows strided).
    q = torch.randn(16, 8 + 2 * 2, 80, generator=g)[:, :8]
    cu = torch.arange(17, dtype=torch.int32)
    kw: dict[str, Any] = {"block_size": 16, "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 80}
    before = tiles.calls
    with torch.inference_mode():
        fast = dk.plan_paged_attention(bt, lens, cu, **kw, cpu_kernel=tiles).run(q, k, v)
        plain = dk.plan_paged_attention(bt, lens, cu, **kw).run(q, k, v)
    assert tiles.calls == before + 1
    assert_attention_close(fast, plain)


def test_other_dtypes_and_autograd_keep_the_torch_path(tiles: CountingTiles) -> None:
    g = torch.Generator().manual_seed(1)
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    lens, cu = torch.tensor([20], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    kw: dict[str, Any] = {"block_size": 16, "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32}
    k, v = torch.randn(2, 16, 2, 32, generator=g), torch.randn(2, 16, 2, 32, generator=g)
    q = torch.randn(1, 4, 32, generator=g)
    plan = dk.plan_paged_attention(bt, lens, cu, **kw, cpu_kernel=tiles)
    before = tiles.calls
    plan.run(q.half(), k.half(), v.half())
    plan.run(q.requires_grad_(), k, v).sum().backward()
    assert tiles.calls == before and q.grad is not None


def test_unavailable_kernel_falls_back(tmp_path: Path, no_c_compiler: None) -> None:
    broken = PagedAttentionTiles(cache_dir=tmp_path, enabled=True)
    bt = torch.tensor([[0]], dtype=torch.int32)
    lens, cu = torch.tensor([5], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    kw: dict[str, Any] = {"block_size": 16, "num_q_heads": 2, "num_kv_heads": 1, "head_dim": 8}
    k, v, q = torch.randn(1, 16, 1, 8), torch.randn(1, 16, 1, 8), torch.randn(1, 2, 8)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        out = dk.plan_paged_attention(bt, lens, cu, **kw, cpu_kernel=broken).run(q, k, v)
    assert torch.equal(out, dk.plan_paged_attention(bt, lens, cu, **kw).run(q, k, v))


@settings(max_examples=40)
@given(
    case=paged_attention_cases(
        dtypes=(torch.float32,), allow_non_causal=True, kinds=("decode", "verify", "extend")
    )
)
def test_bound_layers_equal_run_layer_by_layer(
    tiles: CountingTiles, case: PagedAttentionCase
) -> None:
    """``bind_cpu_layers``: for every layer's caches, the bound call writes exactly what
    ``run`` returns (same kernel, same arguments), reading ``q`` as it is at call time; where
    the plan needs a gather or scatter of rows it declines (None) and ``run`` stays the way."""
    g = torch.Generator().manual_seed(case.q.shape[0])
    layers = [(case.k_cache, case.v_cache)] + [
        (torch.randn(case.k_cache.shape, generator=g), torch.randn(case.v_cache.shape, generator=g))
        for _ in range(2)
    ]
    plan = case.plan(use_triton=False, cpu_kernel=tiles)
    q = case.q.clone()
    out = torch.empty(q.shape)
    with torch.inference_mode():
        bound = plan.bind_cpu_layers(q, [k for k, _ in layers], [v for _, v in layers], out)
        if bound is None:
            q_lens = (case.cu_seqlens_q[1:] - case.cu_seqlens_q[:-1]).tolist()
            assert (
                plan.num_tile_batches != 1
                or max(q_lens, default=0) > MAX_TILE_Q
                or (
                    len(set(q_lens)) > 1  # padded tiles: rows are gathered
                )
            )
            return
        assert len(bound) == len(layers)
        for i, (k, v) in enumerate(layers):
            q.normal_(generator=g)  # a new layer's queries, in the same buffer
            bound(i)
            assert torch.equal(out, plan.run(q, k, v))


def test_bound_layers_check_their_operands(tiles: CountingTiles) -> None:
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    lens, cu = torch.tensor([20], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    kw: dict[str, Any] = {"block_size": 16, "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32}
    k, v = torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32)
    q, out = torch.randn(1, 4, 32), torch.empty(1, 4, 32)
    plan = dk.plan_paged_attention(bt, lens, cu, **kw, cpu_kernel=tiles)
    with pytest.raises(ValueError, match="out: expected contiguous fp32"):
        plan.bind_cpu_layers(q, [k], [v], torch.empty(2, 4, 32))
    with pytest.raises(ValueError, match="v_caches"):
        plan.bind_cpu_layers(q, [k, k], [v], out)
    with pytest.raises(ValueError, match="one layout"):
        plan.bind_cpu_layers(q, [k, torch.randn(3, 16, 2, 32)], [v, torch.randn(3, 16, 2, 32)], out)
    with pytest.raises(ValueError, match="block id 1 is outside"):
        plan.bind_cpu_layers(q, [k[:1]], [v[:1]], out)
    # Nothing to bind to: no CPU kernel, or operands it does not apply to.
    assert dk.plan_paged_attention(bt, lens, cu, **kw).bind_cpu_layers(q, [k], [v], out) is None
    assert plan.bind_cpu_layers(q.half(), [k.half()], [v.half()], out) is None
