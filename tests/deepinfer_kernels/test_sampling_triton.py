"""Triton sampling kernel (interpreter on CPU) against the torch path."""

from __future__ import annotations

import pytest
import torch
from _sampling_stats import check_sample_frequencies
from _stats import assert_matches, device_generator
from _verify_cases import triton_device
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.sampling.torch_sampling import sample_torch, sampling_probs_torch
from deepinfer_kernels.sampling.triton_sampling import sample_triton

DEV = triton_device()


def _random_params(batch: int, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
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
    return temperature, top_k, top_p, min_p


def _run(*args: torch.Tensor, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    rounds = torch.zeros(args[0].shape[0], dtype=torch.int32, device=DEV)
    key = torch.tensor([seed], dtype=torch.int64)
    out = sample_triton(*(a.to(DEV) for a in (*args, key)), rounds=rounds)
    return out.cpu(), rounds.cpu()


@settings(max_examples=5)
@given(
    batch=st.integers(1, 12),
    vocab=st.sampled_from([1, 3, 100, 129, 257]),  # not multiples of the vocabulary chunk
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_kernel_draws_inside_the_kept_set(batch, vocab, dtype, seed):
    """Every token is in the filtered support (``sampling_probs > 0``); greedy rows and rows
    without filters draw exactly the torch path's token (same first uniform, same order)."""
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(batch, vocab, generator=gen)).to(dtype)
    params = _random_params(batch, vocab, gen)
    u = torch.rand(batch, generator=gen)
    got, rounds = _run(logits, *params, u, seed=seed)
    support = sampling_probs_torch(logits, *params) > 0
    assert bool(support[torch.arange(batch), got].all())
    temperature, top_k, top_p, min_p = params
    plain = (temperature == 0) | (((top_k <= 0) | (top_k >= vocab)) & (top_p == 1) & (min_p == 0))
    want = sample_torch(logits, *params, u)
    assert torch.equal(got[plain], want[plain])
    assert bool((rounds[temperature == 0] == 0).all()) and bool(
        (rounds[temperature > 0] >= 1).all()
    )


def test_kernel_ties_and_masked_tokens():
    logits = torch.full((4, 130), float("-inf"))
    logits[:, 129] = 2.0
    logits[:, 5] = 2.0
    logits[:, 64] = 1.0
    t = torch.tensor([0.0, 1.0, 1.0, 1.0])
    k = torch.tensor([0, 1, 2, 0])
    p = torch.tensor([1.0, 1.0, 1.0, 1.0])
    u = torch.tensor([0.0, 0.0, 0.999999, 0.999999])
    got, _ = _run(logits, t, k, p, torch.zeros(4), u)
    # greedy: lowest id among ties; top-k 1 and 2 keep both tied maxima (never the third
    # token); u ~ 1 on an unfiltered row lands on the last token with mass.
    assert got[0] == 5 and got[1] in (5, 129) and got[2] in (5, 129) and got[3] == 129


def test_top_k_and_top_p_together_take_few_rounds():
    """Top-p over the top-k set (the case that needs the top-k mass): a realistic row shape
    (a few likely tokens, a long tail) finishes in a few rounds of two passes each, where
    the bisection kernel made about 68 passes; the draws stay in the kept set."""
    gen = torch.Generator().manual_seed(11)
    batch, vocab = 256, 1000
    logits = torch.randn(batch, vocab, generator=gen) * 2.5
    t = torch.full((batch,), 0.8)
    k = torch.full((batch,), 50)
    p = torch.full((batch,), 0.9)
    m = torch.full((batch,), 0.01)
    got, rounds = _run(logits, t, k, p, m, torch.rand(batch, generator=gen))
    support = sampling_probs_torch(logits, t, k, p, m) > 0
    assert bool(support[torch.arange(batch), got].all())
    assert float(rounds.float().mean()) < 4.0 and int(rounds.max()) <= 16


def test_two_paths_agree_in_distribution_on_top_k_top_p():
    """The kernel's frequencies against the torch path's exact distribution, on the setting
    that exercises the top-k mass bounds (top-p inside a top-k set with a flat tail)."""
    gen = torch.Generator().manual_seed(12)
    vocab, batch = 40, 6000
    logits = torch.randn(vocab, generator=gen).expand(batch, vocab).contiguous()
    t, k, p, m = (torch.full((batch,), v) for v in (1.0, 15, 0.7, 0.0))
    got, _ = _run(logits, t, k.long(), p, m, torch.rand(batch, generator=gen), seed=3)
    assert_matches(got, sampling_probs_torch(logits[:1], t[:1], k[:1].long(), p[:1], m[:1])[0])


@pytest.mark.slow
def test_kernel_frequencies_match_filtered_distribution():
    def triton_sample(logits, t, k, p, m, generator=None):
        args = (a.to(DEV) for a in (logits, t, k, p, m))
        return dk.sample(
            *args, generator=device_generator(generator, DEV), use_triton=True, check_values=False
        ).cpu()

    check_sample_frequencies(triton_sample, rows_per_setting=5_000, vocab=21, seed=6)


def test_ties_at_the_thresholds_are_kept_in_distribution():
    """Integer logits tie in groups: top-k cuts inside a tie group and the top-p nucleus ends
    on one, where every tied token must be kept with its full weight (bf16 logits tie often)."""
    gen = torch.Generator().manual_seed(13)
    vocab, batch = 30, 4000
    logits = torch.randint(-3, 3, (vocab,), generator=gen).float().expand(batch, vocab)
    logits = logits.contiguous()
    ordered = logits[0].sort(descending=True).values
    # The smallest k whose k-th and (k+1)-th largest logits tie: top-k cuts a tie group.
    k_cut = next(k for k in range(1, vocab) if ordered[k - 1] == ordered[k])
    for t, k, p in ((1.0, k_cut, 1.0), (1.0, 0, 0.6), (0.9, k_cut + 2, 0.7)):
        params = [torch.full((batch,), v) for v in (t, k, p, 0.0)]
        params[1] = params[1].long()
        got, _ = _run(logits, *params, torch.rand(batch, generator=gen), seed=k)
        want = sampling_probs_torch(logits[:1], *(x[:1] for x in params))[0]
        if k == k_cut:
            assert int((want > 0).sum()) > k  # the whole tie group is kept
        assert_matches(got, want)
