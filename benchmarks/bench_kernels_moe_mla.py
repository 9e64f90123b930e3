"""CPU benchmark: ``fused_moe`` and ``mla_paged_attention`` torch paths against baselines run in
the same process.

* ``fused_moe`` (pairs sorted by expert, one GEMM pair per expert with tokens) against the
  per-expert loop of Hugging Face's Mixtral/Qwen-MoE blocks (``where(ids == e)`` for every
  expert) and against a dense mixture (every expert on every token, the naive upper bound).
  Shape: a small fine-grained MoE layer (hidden 512, intermediate 256, 32 experts, top 4),
  1 / 16 / 128 tokens.
* ``mla_paged_attention`` decode (DeepSeek-V3 widths: 16 heads, rank 512, rope 64, block 64)
  against the reference loop, batch 4 x 1024 positions.

One intra-op thread on both sides. Run::

    .venv/bin/pytest benchmarks/bench_kernels_moe_mla.py --benchmark-only -q -s

Each ``ours`` test prints ``baseline median / ours median`` (> 1: ours is faster).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from deepinfer_kernels import fused_moe, mla_decode_attention, moe_route
from deepinfer_kernels.reference import mla_paged_attention_reference
from deepinfer_kernels.testing.mla import build_mla_case

H, INTER, E, K = 512, 256, 32, 4
TOKENS = (1, 16, 128)
_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _moe(tokens: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(tokens)
    hidden = torch.randn(tokens, H, generator=gen)
    w_gate_up = torch.randn(E, 2 * INTER, H, generator=gen) / H**0.5
    w_down = torch.randn(E, H, INTER, generator=gen) / INTER**0.5
    weights, ids = moe_route(torch.randn(tokens, E, generator=gen), K, renormalize=True)
    return hidden, w_gate_up, w_down, weights, ids


def per_expert_loop(hidden, w_gate_up, w_down, weights, ids):  # type: ignore[no-untyped-def]
    """Hugging Face's MoE block: a boolean mask per expert, every expert visited."""
    out = torch.zeros_like(hidden)
    mask = F.one_hot(ids.long(), E).permute(2, 1, 0)  # [E, K, T]
    for e in range(E):
        slot, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        gate, up = (hidden[tok] @ w_gate_up[e].t()).chunk(2, -1)
        y = (F.silu(gate) * up) @ w_down[e].t()
        out.index_add_(0, tok, y * weights[tok, slot, None])
    return out


def dense_mixture(hidden, w_gate_up, w_down, weights, ids):  # type: ignore[no-untyped-def]
    """Every expert on every token, weighted by a dense routing matrix."""
    route = torch.zeros(hidden.shape[0], E).scatter_(1, ids.long(), weights)
    gate, up = torch.einsum("th,eih->eti", hidden, w_gate_up).chunk(2, -1)
    y = torch.einsum("eti,ehi->eth", F.silu(gate) * up, w_down)
    return torch.einsum("eth,te->th", y, route)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("baseline", ["loop", "dense"])
def test_moe_baseline(benchmark, tokens, baseline):  # type: ignore[no-untyped-def]
    fn = per_expert_loop if baseline == "loop" else dense_mixture
    args = _moe(tokens)
    out = benchmark(fn, *args)
    _TIMES[f"{baseline}-{tokens}"] = benchmark.stats.stats.median
    torch.testing.assert_close(out, fused_moe(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tokens", TOKENS)
def test_moe_ours(benchmark, tokens):  # type: ignore[no-untyped-def]
    args = _moe(tokens)
    out = benchmark(fused_moe, *args)
    assert out.shape == (tokens, H)
    for baseline in ("loop", "dense"):
        if f"{baseline}-{tokens}" in _TIMES:
            ratio = _TIMES[f"{baseline}-{tokens}"] / benchmark.stats.stats.median
            print(f"\nfused_moe {tokens} tokens: {ratio:.2f}x {baseline}")


def _mla():  # type: ignore[no-untyped-def]
    return build_mla_case([1] * 4, [1024] * 4, heads=16, rank=512, rope=64, block_size=64, seed=0)


def test_mla_reference_baseline(benchmark):  # type: ignore[no-untyped-def]
    case = _mla()
    benchmark(mla_paged_attention_reference, *case.tensors(), scale=case.scale)
    _TIMES["mla-ref"] = benchmark.stats.stats.median


def test_mla_ours(benchmark):  # type: ignore[no-untyped-def]
    case = _mla()
    out = benchmark(mla_decode_attention, *case.tensors()[:5], scale=case.scale)
    ref = mla_paged_attention_reference(*case.tensors(), scale=case.scale)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    if "mla-ref" in _TIMES:
        print(
            f"\nmla decode 4 x 1024: {_TIMES['mla-ref'] / benchmark.stats.stats.median:.2f}x reference"
        )
