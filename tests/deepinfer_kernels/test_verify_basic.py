"""speculative_verify / greedy_verify: torch path == readable reference, structure, edge cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _verify_cases import random_problem, triton_device
from hypothesis import given
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import greedy_verify_reference, speculative_verify_reference
from deepinfer_kernels.verify.torch_verify import greedy_verify_torch, speculative_verify_torch


def _uniforms(batch: int, gamma: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1000)
    return torch.rand(batch, gamma, generator=gen), torch.rand(batch, generator=gen)


@given(
    batch=st.integers(1, 12),
    gamma=st.integers(0, 6),
    vocab=st.integers(1, 40),
    zero_frac=st.sampled_from([0.0, 0.5, 0.9]),
    one_hot=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_torch_path_matches_reference(batch, gamma, vocab, zero_frac, one_hot, seed):
    ids, p_d, p_t, n = random_problem(batch, gamma, vocab, seed, zero_frac)
    draft = None if one_hot else p_d
    au, su = _uniforms(batch, gamma, seed)
    got = speculative_verify_torch(ids, draft, p_t, n, au, su)
    want = speculative_verify_reference(ids, draft, p_t, n, au, su)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@given(
    batch=st.integers(1, 12),
    gamma=st.integers(0, 6),
    vocab=st.integers(1, 30),
    seed=st.integers(0, 2**16),
)
def test_greedy_matches_reference(batch, gamma, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    # Few distinct values so that ties (lowest id wins) actually occur.
    logits = torch.randint(0, 3, (batch, gamma + 1, vocab), generator=gen).float()
    best = logits.argmax(-1)
    ids = torch.where(torch.rand(batch, gamma, generator=gen) < 0.7, best[:, :gamma], 0)
    n = torch.randint(0, gamma + 1, (batch,), generator=gen)
    ids = torch.where(torch.arange(gamma)[None] < n[:, None], ids, -1)
    got = dk.greedy_verify(ids, logits, n)
    want = greedy_verify_reference(ids, logits, n)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(greedy_verify_torch(ids, logits, n)[0], want[0])


def test_output_structure_and_padding():
    ids, p_d, p_t, n = random_problem(64, 5, 17, seed=3)
    res = dk.speculative_verify(ids, p_d, p_t, n, generator=torch.Generator().manual_seed(0))
    assert isinstance(res, dk.VerifyResult)
    assert res.output_ids.shape == (64, 6) and res.output_ids.dtype == torch.int64
    assert torch.equal(res.num_emitted, res.num_accepted + 1)
    assert bool((res.num_accepted <= n).all())
    valid = torch.arange(6)[None] < res.num_emitted[:, None]
    assert bool((res.output_ids[valid] >= 0).all()) and bool((res.output_ids[valid] < 17).all())
    assert bool((res.output_ids[~valid] == -1).all())
    acc = torch.arange(5)[None] < res.num_accepted[:, None]
    assert torch.equal(res.output_ids[:, :5][acc], ids[acc])


def test_generator_makes_it_reproducible():
    ids, p_d, p_t, n = random_problem(32, 4, 9, seed=5)
    a = dk.speculative_verify(ids, p_d, p_t, n, generator=torch.Generator().manual_seed(7))
    b = dk.speculative_verify(ids, p_d, p_t, n, generator=torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_zero_drafts_emits_only_bonus_from_first_target_row():
    ids, p_d, p_t, _ = random_problem(8, 3, 5, seed=1)
    n = torch.zeros(8, dtype=torch.int64)
    ids = torch.full_like(ids, -1)
    p_t[:, 0] = 0.0
    p_t[:, 0, 2] = 1.0  # the bonus row is a point mass at 2
    res = dk.speculative_verify(ids, p_d, p_t, n)
    assert torch.equal(res.num_accepted, torch.zeros(8, dtype=torch.int64))
    assert bool((res.output_ids[:, 0] == 2).all()) and bool((res.output_ids[:, 1:] == -1).all())


def test_padding_ids_are_never_read():
    # -1, huge and negative garbage beyond num_draft_tokens: no error, same result as -1.
    ids, p_d, p_t, n = random_problem(16, 4, 7, seed=2)
    au, su = _uniforms(16, 4, 2)
    base = speculative_verify_torch(ids, p_d, p_t, n, au, su)
    beyond = torch.arange(4)[None] >= n[:, None]
    for pad in (10**9, -(10**9)):
        garbage = torch.where(beyond, pad, ids)
        got = speculative_verify_torch(garbage, p_d, p_t, n, au, su)
        assert torch.equal(got[0], base[0])
        dk.speculative_verify(garbage, p_d, p_t, n)  # validation accepts padding


def test_uniform_exactly_zero_never_accepts_target_zero_nor_emits_zero_prob_token():
    vocab = 6
    p_t = torch.zeros(1, 2, vocab)
    p_t[0, 0, 4] = 1.0  # target puts no mass on the draft token 1, nor on token 0
    p_t[0, 1, 5] = 1.0
    p_d = torch.zeros(1, 1, vocab)
    p_d[0, 0, 1] = 1.0
    ids = torch.tensor([[1]])
    n = torch.tensor([1])
    zero_u = torch.zeros(1, 1)
    for draft in (p_d, None):
        out, acc, _ = speculative_verify_torch(ids, draft, p_t, n, zero_u, torch.zeros(1))
        assert int(acc[0]) == 0 and int(out[0, 0]) == 4
        out, acc, _ = speculative_verify_reference(ids, draft, p_t, n, zero_u, torch.zeros(1))
        assert int(acc[0]) == 0 and int(out[0, 0]) == 4


def test_draft_zero_under_positive_target_is_accepted():
    # An inconsistent drafter proposes a token it gave probability 0: min(1, p_t / 0) = 1.
    p_t = torch.full((1, 2, 3), 1 / 3)
    p_d = torch.tensor([[[0.0, 1.0, 0.0]]])
    out, acc, _ = speculative_verify_torch(
        torch.tensor([[0]]), p_d, p_t, torch.tensor([1]), torch.full((1, 1), 0.999), torch.zeros(1)
    )
    assert int(acc[0]) == 1 and int(out[0, 0]) == 0


def test_rejection_with_no_residual_mass_falls_back_to_target():
    # p_t == p_d: rejection cannot happen in exact arithmetic; if the drafter reports the same
    # row but the draft token is a target zero, the residual is empty -> sample p_t.
    p = torch.tensor([[[0.0, 0.5, 0.5]]])
    p_t = torch.cat([p, p], dim=1)
    out, acc, _ = speculative_verify_torch(
        torch.tensor([[0]]), p, p_t, torch.tensor([1]), torch.zeros(1, 1), torch.zeros(1)
    )
    assert int(acc[0]) == 0 and int(out[0, 0]) in (1, 2)


@pytest.mark.parametrize("use_triton", [False, True])
@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("target", float("nan"), "target_probs"),
        ("target", -0.1, "target_probs"),
        ("target", float("inf"), "target_probs"),
        ("draft", float("nan"), "draft_probs"),
        ("draft", -1.0, "draft_probs"),
        ("target_scalar", -0.5, "target_probs"),
        ("draft_scalar", -0.5, "draft_probs"),
    ],
)
def test_bad_probabilities_that_are_read_raise(field, value, match, use_triton):
    # Every request verifies one draft, token 0; the target gives it no mass, so every request
    # rejects at position 0 and draws from row 0 of both tensors, which are therefore read.
    ids = torch.zeros(4, 2, dtype=torch.int64)
    n = torch.ones(4, dtype=torch.int64)
    p_t = torch.full((4, 3, 5), 0.25)
    p_t[:, :, 0] = 0.0
    p_d = torch.full((4, 2, 5), 0.2)
    if field == "target":
        p_t[1, 0, 3] = value
    elif field == "draft":
        p_d[1, 0, 3] = value
    elif field == "target_scalar":  # the acceptance scalar p_t(x_0) itself
        p_t[1, 0, 0] = value
    else:
        p_d[1, 0, 0] = value
    if use_triton:
        p_t, p_d, ids, n = (t.to(triton_device()) for t in (p_t, p_d, ids, n))
    with pytest.raises(ValueError, match=match):
        dk.speculative_verify(ids, p_d, p_t, n, use_triton=use_triton)


@pytest.mark.parametrize("use_triton", [False, True])
def test_values_never_read_do_not_matter(use_triton):
    # NaN in a row no draw can come from (position 2 with num_draft_tokens = 1) changes nothing.
    ids, p_d, p_t, _ = random_problem(6, 3, 9, seed=12, pad=0)
    n = torch.ones(6, dtype=torch.int64)
    dirty = p_t.clone()
    dirty[:, 3] = float("nan")
    dirty[:, 2] = -1.0
    dev = triton_device() if use_triton else "cpu"
    a = dk.speculative_verify(
        ids.to(dev), p_d.to(dev), p_t.to(dev), n.to(dev),
        generator=torch.Generator(device=dev).manual_seed(1), use_triton=use_triton,
    )  # fmt: skip
    assert bool((a.num_emitted <= 2).all())
    b = dk.speculative_verify(
        ids.to(dev), p_d.to(dev), dirty.to(dev), n.to(dev),
        generator=torch.Generator(device=dev).manual_seed(1), use_triton=use_triton,
    )  # fmt: skip
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("use_triton", [False, True])
def test_drawn_row_without_mass_raises(use_triton):
    p_t = torch.full((2, 2, 4), 0.25)
    p_t[1, 0] = 0.0  # request 1 verifies nothing, so its bonus comes from this empty row
    dev = triton_device() if use_triton else "cpu"
    with pytest.raises(ValueError, match="zero total"):
        dk.speculative_verify(
            torch.zeros(2, 1, dtype=torch.int64, device=dev),
            None,
            p_t.to(dev),
            torch.zeros(2, dtype=torch.int64, device=dev),
            use_triton=use_triton,
        )


def test_bad_structure_raises():
    ids, p_d, p_t, n = random_problem(4, 3, 5, seed=0)
    with pytest.raises(ValueError, match="target_probs"):
        dk.speculative_verify(ids, p_d, p_t[:, :3], n)
    with pytest.raises(ValueError, match="draft_probs"):
        dk.speculative_verify(ids, p_d[:, :, :4], p_t, n)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        dk.speculative_verify(ids, p_d, p_t, n[:3])
    with pytest.raises(ValueError, match="num_draft_tokens"):
        dk.speculative_verify(ids, p_d, p_t, torch.tensor([0, 1, 4, 0]))
    with pytest.raises(ValueError, match="num_draft_tokens"):
        dk.speculative_verify(ids, p_d, p_t, torch.tensor([0, -1, 2, 0]))
    with pytest.raises(TypeError, match="draft_token_ids"):
        dk.speculative_verify(ids.float(), p_d, p_t, n)
    with pytest.raises(TypeError, match="target_probs"):
        dk.speculative_verify(ids, p_d, p_t.to(torch.int64), n)
    bad = ids.clone()
    bad[:, 0] = 5
    with pytest.raises(ValueError, match="draft_token_ids"):
        dk.speculative_verify(bad, p_d, p_t, torch.full((4,), 3))
    bad[:, 0] = -1
    with pytest.raises(ValueError, match="draft_token_ids"):
        dk.speculative_verify(bad, p_d, p_t, torch.full((4,), 3))
    with pytest.raises(ValueError, match="target_logits"):
        logits = torch.randn(4, 4, 5)
        logits[0, 0, 0] = float("nan")
        dk.greedy_verify(ids, logits, n)


def test_half_precision_inputs():
    ids, p_d, p_t, n = random_problem(16, 4, 11, seed=4)
    au, su = _uniforms(16, 4, 4)
    got = speculative_verify_torch(ids, p_d.half(), p_t.bfloat16(), n, au, su)
    want = speculative_verify_reference(ids, p_d.half(), p_t.bfloat16(), n, au, su)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_dlpack_numpy_in_numpy_out():
    ids, p_d, p_t, n = random_problem(8, 3, 6, seed=9)
    res = dk.speculative_verify(ids.numpy(), p_d.numpy(), p_t.numpy(), n.numpy())
    assert isinstance(res.output_ids, np.ndarray) and res.output_ids.shape == (8, 4)
    assert isinstance(res.num_accepted, np.ndarray)
    g = dk.greedy_verify(ids.numpy(), p_t.numpy(), n.numpy())
    assert isinstance(g.output_ids, np.ndarray)
    assert np.array_equal(g.output_ids, greedy_verify_reference(ids, p_t, n)[0].numpy())
