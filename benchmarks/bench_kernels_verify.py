"""CPU benchmark: torch paths of ``speculative_verify`` and ``sample`` against naive loops.

Shapes: B = 64 requests, gamma = 5 drafts, V = 32000, fp32. The baselines are per-request
Python loops in plain torch (the readable references in ``deepinfer_kernels.reference``, which
compute the same tokens from the same uniforms), measured in the same run. Run::

    .venv/bin/pytest benchmarks/bench_kernels_verify.py --benchmark-only -q

The last test of each pair prints the speed-up (baseline median / ours).

Both sides run with one intra-op thread: on a shared, oversubscribed machine OpenMP parallel
regions stall waiting for their second thread, which would measure the neighbours' load rather
than the algorithms (the naive loop's per-row ops are below the parallel grain size and would
escape that penalty).
"""

from __future__ import annotations

import pytest
import torch

import deepinfer_kernels as dk
from deepinfer_kernels.reference import sample_reference, speculative_verify_reference

B, G, V = 64, 5, 32000
_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def verify_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    p_t = torch.softmax(2 * torch.randn(B, G + 1, V, generator=g), -1)
    p_d = torch.softmax(2 * torch.randn(B, G, V, generator=g), -1)
    ids = torch.multinomial(p_d.view(-1, V), 1, generator=g).view(B, G)
    n = torch.randint(0, G + 1, (B,), generator=g)
    ids = torch.where(torch.arange(G)[None] < n[:, None], ids, -1)
    return {"draft_token_ids": ids, "draft_probs": p_d, "target_probs": p_t, "num_draft_tokens": n}


@pytest.fixture(scope="module")
def sample_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "logits": 3 * torch.randn(B, V, generator=g),
        "temperature": torch.full((B,), 0.8),
        "top_k": torch.full((B,), 50),
        "top_p": torch.full((B,), 0.9),
        "min_p": torch.full((B,), 0.0),
    }


def _uniforms() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return torch.rand(B, G, generator=g), torch.rand(B, generator=g)


def test_verify_naive_loop(benchmark, verify_inputs):  # type: ignore[no-untyped-def]
    au, su = _uniforms()
    out = benchmark(speculative_verify_reference, *verify_inputs.values(), au, su)
    _TIMES["verify_naive"] = benchmark.stats.stats.median
    assert out[0].shape == (B, G + 1)


def test_verify_ours(benchmark, verify_inputs):  # type: ignore[no-untyped-def]
    res = benchmark(dk.speculative_verify, **verify_inputs, use_triton=False)
    _TIMES["verify_ours"] = benchmark.stats.stats.median
    assert res.output_ids.shape == (B, G + 1)
    if "verify_naive" in _TIMES:
        ratio = _TIMES["verify_naive"] / _TIMES["verify_ours"]
        print(f"\nspeculative_verify CPU speed-up over the per-request loop: {ratio:.2f}x")


def test_verify_ours_unchecked(benchmark, verify_inputs):  # type: ignore[no-untyped-def]
    res = benchmark(dk.speculative_verify, **verify_inputs, use_triton=False, check_values=False)
    _TIMES["verify_unchecked"] = benchmark.stats.stats.median
    assert res.output_ids.shape == (B, G + 1)
    if "verify_naive" in _TIMES:
        ratio = _TIMES["verify_naive"] / _TIMES["verify_unchecked"]
        print(f"\nspeculative_verify (check_values=False) speed-up over the loop: {ratio:.2f}x")


def test_sample_naive_loop(benchmark, sample_inputs):  # type: ignore[no-untyped-def]
    _, su = _uniforms()
    out = benchmark(sample_reference, *sample_inputs.values(), su)
    _TIMES["sample_naive"] = benchmark.stats.stats.median
    assert out.shape == (B,)


def test_sample_multinomial_unfiltered(benchmark, sample_inputs):  # type: ignore[no-untyped-def]
    logits = sample_inputs["logits"]

    def multinomial() -> torch.Tensor:
        return torch.multinomial(torch.softmax(logits / 0.8, -1), 1).squeeze(1)

    out = benchmark(multinomial)
    _TIMES["multinomial"] = benchmark.stats.stats.median
    assert out.shape == (B,)


def test_sample_ours(benchmark, sample_inputs):  # type: ignore[no-untyped-def]
    out = benchmark(dk.sample, **sample_inputs, use_triton=False)
    _TIMES["sample_ours"] = benchmark.stats.stats.median
    assert out.shape == (B,)
    if "sample_naive" in _TIMES:
        ratio = _TIMES["sample_naive"] / _TIMES["sample_ours"]
        print(f"\nsample (top-k 50, top-p 0.9) CPU speed-up over the per-row loop: {ratio:.2f}x")
    if "multinomial" in _TIMES:
        ratio = _TIMES["multinomial"] / _TIMES["sample_ours"]
        print(f"sample (filtered) vs unfiltered softmax + multinomial: {ratio:.2f}x")
