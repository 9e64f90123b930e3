"""Triton verification kernels (interpreter on CPU) against the torch path."""

from __future__ import annotations

import pytest
import torch
from _stats import device_generator
from _verify_cases import random_problem, triton_device
from _verify_stats import check_first_token, check_first_two_tokens
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.verify.torch_verify import greedy_verify_torch, speculative_verify_torch
from deepinfer_kernels.verify.triton_verify import greedy_verify_triton, speculative_verify_triton

DEV = triton_device()


def _on(*ts):
    return [None if t is None else t.to(DEV) for t in ts]


@settings(max_examples=8)
@given(
    batch=st.integers(1, 24),
    gamma=st.integers(0, 5),
    vocab=st.sampled_from([1, 7, 64, 65, 129, 300]),  # not multiples of the chunk, and chunk+1
    zero_frac=st.sampled_from([0.0, 0.6]),
    one_hot=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_speculative_kernel_matches_torch_path(
    batch, gamma, vocab, zero_frac, one_hot, dtype, seed
):
    ids, p_d, p_t, n = random_problem(batch, gamma, vocab, seed, zero_frac)
    p_t, p_d = p_t.to(dtype), p_d.to(dtype)
    draft = None if one_hot else p_d
    gen = torch.Generator().manual_seed(seed)
    au, su = torch.rand(batch, gamma, generator=gen), torch.rand(batch, generator=gen)
    want = speculative_verify_torch(ids, draft, p_t, n, au, su)
    got = speculative_verify_triton(*_on(ids, draft, p_t, n, au, su))
    # Acceptance is decided by the same fp32 comparisons; the drawn token agrees unless a
    # uniform lies within rounding of a CDF boundary (not the case for these seeds).
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)


def test_speculative_kernel_strided_and_padded_inputs():
    ids, p_d, p_t, n = random_problem(9, 4, 33, seed=8, pad=-7)
    wide = torch.zeros(9, 5, 40)
    wide[:, :, :33] = p_t
    p_t_view = wide[:, :, :33]  # non-contiguous rows
    ids_view = torch.stack([ids, ids], dim=2).reshape(9, 8)[:, ::2]  # stride 2
    gen = torch.Generator().manual_seed(1)
    au, su = torch.rand(9, 4, generator=gen), torch.rand(9, generator=gen)
    want = speculative_verify_torch(ids, p_d, p_t, n, au, su)
    got = speculative_verify_triton(*_on(ids_view, p_d, p_t_view, n.int(), au, su))
    assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want))


def test_uniform_zero_in_kernel():
    p_t = torch.zeros(1, 2, 70)
    p_t[0, 0, 66] = 1.0
    p_t[0, 1, 3] = 1.0
    p_d = torch.zeros(1, 1, 70)
    p_d[0, 0, 1] = 1.0
    out, acc, _ = speculative_verify_triton(
        *_on(torch.tensor([[1]]), p_d, p_t, torch.tensor([1]), torch.zeros(1, 1), torch.zeros(1))
    )
    assert int(acc[0]) == 0 and int(out[0, 0]) == 66


@settings(max_examples=6)
@given(
    batch=st.integers(1, 16),
    gamma=st.integers(0, 4),
    vocab=st.sampled_from([1, 5, 129, 200]),
    seed=st.integers(0, 2**16),
)
def test_greedy_kernel_matches_torch_path(batch, gamma, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 3, (batch, gamma + 1, vocab), generator=gen).float()
    best = logits.argmax(-1)
    ids = torch.where(torch.rand(batch, gamma, generator=gen) < 0.8, best[:, :gamma], 0)
    n = torch.randint(0, gamma + 1, (batch,), generator=gen)
    ids = torch.where(torch.arange(gamma)[None] < n[:, None], ids, -1)
    want = greedy_verify_torch(ids, logits, n)
    got = greedy_verify_triton(*_on(ids, logits, n))
    assert all(torch.equal(g.cpu(), w) for g, w in zip(got, want))


def _triton_verify(ids, draft, target, n, generator=None):
    got = dk.speculative_verify(
        *_on(ids, draft, target, n),
        generator=device_generator(generator, DEV),
        use_triton=True,
        check_values=False,
    )
    return type(got)(*(t.cpu() for t in got))


@pytest.mark.parametrize("one_hot", [False, True])
def test_kernel_first_token_statistics(one_hot):
    check_first_token(
        _triton_verify, 20_000, vocab=24, gamma=3, seed=2, zero_frac=0.3, one_hot=one_hot
    )


def test_kernel_two_token_statistics():
    check_first_two_tokens(_triton_verify, 20_000, vocab=6, seed=4, zero_frac=0.2)
