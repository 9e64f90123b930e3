"""sample / sampling_probs: torch path == reference, filter semantics, validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import sample_reference, sampling_probs_reference
from deepinfer_kernels.sampling.torch_sampling import sample_torch, sampling_probs_torch


def _params(batch: int, vocab: int, gen: torch.Generator):
    temperature = torch.where(
        torch.rand(batch, generator=gen) < 0.2, 0.0, 0.3 + 2 * torch.rand(batch, generator=gen)
    )
    top_k = torch.randint(-1, vocab + 2, (batch,), generator=gen)
    top_p = torch.where(
        torch.rand(batch, generator=gen) < 0.3, 1.0, torch.rand(batch, generator=gen)
    )
    top_p = top_p.clamp(min=0.05)
    min_p = torch.where(
        torch.rand(batch, generator=gen) < 0.5, 0.0, 0.3 * torch.rand(batch, generator=gen)
    )
    return temperature, top_k, top_p, min_p


@given(batch=st.integers(1, 10), vocab=st.integers(1, 50), seed=st.integers(0, 2**16))
def test_torch_path_matches_reference(batch, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(batch, vocab, generator=gen)
    params = _params(batch, vocab, gen)
    got = sampling_probs_torch(logits, *params)
    want = sampling_probs_reference(logits, *params)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    u = torch.rand(batch, generator=gen)
    assert torch.equal(sample_torch(logits, *params, u), sample_reference(logits, *params, u))


@given(batch=st.integers(1, 8), vocab=st.integers(2, 64), seed=st.integers(0, 2**16))
def test_support_never_violated(batch, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    # Integer logits create ties at the thresholds.
    logits = torch.randint(-3, 3, (batch, vocab), generator=gen).float()
    temperature, top_k, top_p, min_p = _params(batch, vocab, gen)
    temperature = temperature.clamp(min=0.5)
    probs = torch.softmax(logits / temperature[:, None], -1)
    tokens = torch.stack(
        [dk.sample(logits, temperature, top_k, top_p, min_p, generator=gen) for _ in range(20)], 1
    )
    p_tok = probs.gather(1, tokens)
    sorted_p = probs.sort(-1, descending=True).values
    for b in range(batch):
        k = int(top_k[b])
        if 0 < k < vocab:  # at most k-1 tokens are strictly more likely than any drawn token
            assert bool((p_tok[b] >= sorted_p[b, k - 1]).all())
        assert bool((p_tok[b] >= float(min_p[b]) * float(sorted_p[b, 0]) - 1e-7).all())
        if float(top_p[b]) < 1 and not 0 < k < vocab:
            # mass strictly above a drawn token's probability stays below top_p
            for p in p_tok[b].tolist():
                assert float(probs[b][probs[b] > p].sum()) < float(top_p[b]) + 1e-6


def test_greedy_ties_lowest_id_and_ignores_filters():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    out = dk.sample(logits, 0.0, 1, 0.1, 0.5)
    assert out.tolist() == [1, 0]


def test_top_k_one_is_argmax_and_disabled_values():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 10, generator=gen)
    assert torch.equal(dk.sample(logits, 1.0, 1, 1.0, generator=gen), logits.argmax(-1))
    full = dk.sampling_probs(logits, 1.0, 0, 1.0)
    torch.testing.assert_close(full, torch.softmax(logits, -1))
    for k in (-5, 10, 11):
        torch.testing.assert_close(dk.sampling_probs(logits, 1.0, k, 1.0), full)


def test_top_p_keeps_smallest_nucleus_and_ties():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.2, 0.1]]))
    probs = dk.sampling_probs(logits, 1.0, 0, 0.6)
    # 0.5 < 0.6, so the next value 0.2 joins; its tie partner joins too.
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.2, 0.2, 0.0]]) / 0.9)
    probs = dk.sampling_probs(logits, 1.0, 0, 0.5)
    torch.testing.assert_close(probs, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    probs = dk.sampling_probs(logits, 1.0, 2, 0.9, 0.0)  # top-k keeps the tie, top-p over 0.9
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.2, 0.2, 0.0]]) / 0.9)
    probs = dk.sampling_probs(logits, 1.0, 0, 1.0, 0.3)
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.2, 0.2, 0.0]]) / 0.9)


def test_scalar_and_tensor_params_agree():
    logits = torch.randn(5, 7)
    a = dk.sampling_probs(logits, 0.7, 3, 0.8, 0.05)
    b = dk.sampling_probs(
        logits,
        torch.full((5,), 0.7),
        torch.full((5,), 3),
        torch.full((5,), 0.8),
        torch.full((5,), 0.05),
    )
    assert torch.equal(a, b)


def test_masked_tokens_never_drawn():
    logits = torch.full((1000, 9), float("-inf"))
    logits[:, 4] = 0.0
    logits[:, 8] = 1.0
    out = dk.sample(logits, 1.0, 0, 1.0, generator=torch.Generator().manual_seed(0))
    assert set(out.tolist()) <= {4, 8}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"temperature": torch.ones(3)}, "temperature"),
    ],
)
def test_bad_params_raise(kwargs, match):
    args = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": None} | kwargs
    with pytest.raises(ValueError, match=match):
        dk.sample(torch.randn(4, 6), **args)


def test_bad_logits_raise():
    for value, match in ((float("nan"), "NaN"), (float("inf"), r"\+inf")):
        logits = torch.randn(2, 5)
        logits[1, 3] = value
        with pytest.raises(ValueError, match=match):
            dk.sample(logits, 1.0, 0, 1.0)
    with pytest.raises(ValueError, match="-inf"):
        dk.sample(torch.full((2, 5), float("-inf")), 1.0, 0, 1.0)
    with pytest.raises(ValueError, match="logits"):
        dk.sample(torch.randn(5), 1.0, 0, 1.0)
    with pytest.raises(TypeError, match="top_k"):
        dk.sample(torch.randn(2, 5), 1.0, torch.ones(2), 1.0)


def test_dlpack_numpy():
    logits = np.random.default_rng(0).standard_normal((6, 11)).astype(np.float32)
    out = dk.sample(logits, 0.0, 0, 1.0)
    assert isinstance(out, np.ndarray)
    assert np.array_equal(out, logits.argmax(-1))
