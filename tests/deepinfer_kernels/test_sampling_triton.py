"""Triton sampling kernel (interpreter on CPU) against the torch path."""

from __future__ import annotations

import pytest
import torch
from _sampling_stats import check_sample_frequencies
from _stats import device_generator
from _verify_cases import triton_device
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.sampling.torch_sampling import sample_torch
from deepinfer_kernels.sampling.triton_sampling import sample_triton

DEV = triton_device()


@settings(max_examples=5)
@given(
    batch=st.integers(1, 12),
    vocab=st.sampled_from([1, 3, 100, 129, 257]),  # not multiples of the vocabulary chunk
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_kernel_matches_torch_path(batch, vocab, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(batch, vocab, generator=gen)).to(dtype)
    temperature = torch.where(
        torch.rand(batch, generator=gen) < 0.2, 0.0, 0.3 + torch.rand(batch, generator=gen)
    )
    top_k = torch.randint(-1, vocab + 2, (batch,), generator=gen)
    top_p = torch.where(
        torch.rand(batch, generator=gen) < 0.3, 1.0, torch.rand(batch, generator=gen)
    )
    top_p = top_p.clamp(min=0.05)
    min_p = torch.where(
        torch.rand(batch, generator=gen) < 0.5, 0.0, 0.2 * torch.rand(batch, generator=gen)
    )
    u = torch.rand(batch, generator=gen)
    args = (logits, temperature, top_k, top_p, min_p, u)
    want = sample_torch(*args)
    got = sample_triton(*(a.to(DEV) for a in args)).cpu()
    # Same uniforms, same thresholds: only a uniform within rounding of a boundary could differ.
    assert torch.equal(got, want)


def test_kernel_ties_and_masked_tokens():
    logits = torch.full((4, 130), float("-inf"))
    logits[:, 129] = 2.0
    logits[:, 5] = 2.0
    logits[:, 64] = 1.0
    t = torch.tensor([0.0, 1.0, 1.0, 1.0])
    k = torch.tensor([0, 1, 2, 0])
    p = torch.tensor([1.0, 1.0, 1.0, 0.3])
    u = torch.tensor([0.0, 0.0, 0.999999, 0.999999])
    got = sample_triton(*(a.to(DEV) for a in (logits, t, k, p, torch.zeros(4), u))).cpu()
    # greedy: lowest id among ties; top-k 1 keeps both tied maxima; u ~ 1 lands on the last kept.
    assert got.tolist() == [5, 5, 129, 129]
    assert torch.equal(got, sample_torch(logits, t, k, p, torch.zeros(4), u))


@pytest.mark.slow
def test_kernel_frequencies_match_filtered_distribution():
    def triton_sample(logits, t, k, p, m, generator=None):
        args = (a.to(DEV) for a in (logits, t, k, p, m))
        return dk.sample(
            *args, generator=device_generator(generator, DEV), use_triton=True, check_values=False
        ).cpu()

    check_sample_frequencies(triton_sample, rows_per_setting=5_000, vocab=21, seed=6)
