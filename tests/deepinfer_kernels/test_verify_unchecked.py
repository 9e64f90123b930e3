"""Verification inputs: normalisation is required and checked, errors name the tensor at fault,
and with ``check_values=False`` both paths agree on corrupt ids and counts (#23 item 6)."""

from __future__ import annotations

import pytest
import torch
from _verify_cases import random_problem, triton_device

import deepinfer_kernels as dk


def test_unnormalised_target_row_is_refused() -> None:
    ids, p_d, p_t, n = random_problem(4, 3, 7, seed=3)
    n = torch.full((4,), 2)
    ids = torch.where(torch.arange(3)[None, :] < 2, ids.clamp(min=0), -1)
    p_t[1, 2] *= 0.5  # a row that is read (the bonus row of a fully accepted request)
    with pytest.raises(ValueError, match=r"target_probs: row \[1, 2\] sums to 0.5"):
        dk.speculative_verify(ids, p_d, p_t, n)
    p_t[1, 2] *= 2.0
    p_t[0, 3] *= 0.5  # row 3 is never read with n = 2: not inspected
    dk.speculative_verify(ids, p_d, p_t, n)


def test_unnormalised_draft_row_is_refused_and_named() -> None:
    ids, p_d, p_t, n = random_problem(4, 3, 7, seed=4)
    n = torch.full((4,), 3)
    ids = ids.clamp(min=0)
    p_d[2, 1] *= 3.0
    with pytest.raises(ValueError, match=r"draft_probs: row \[2, 1\]"):
        dk.speculative_verify(ids, p_d, p_t, n)


def test_half_precision_rows_within_tolerance_pass() -> None:
    ids, p_d, p_t, n = random_problem(8, 3, 1000, seed=5)
    res = dk.speculative_verify(ids, p_d.bfloat16(), p_t.half(), n)
    assert res.output_ids.shape == (8, 4)


def test_vocabulary_mismatch_names_the_target() -> None:
    ids, p_d, p_t, n = random_problem(4, 3, 7, seed=6)
    wide = torch.cat([p_t, torch.zeros(4, 4, 1)], dim=-1)
    with pytest.raises(ValueError, match=r"^target_probs: vocabulary size 8 does not match"):
        dk.speculative_verify(ids, p_d, wide, n)
    with pytest.raises(ValueError, match=r"^draft_probs: expected shape \(4, 3, 7\)"):
        dk.speculative_verify(ids, p_d[:, :2], p_t, n)


def _corrupt(seed: int) -> tuple[torch.Tensor, ...]:
    ids, p_d, p_t, n = random_problem(16, 4, 9, seed=seed, pad=-1)
    gen = torch.Generator().manual_seed(seed)
    # Out-of-vocabulary ids in verified slots (negative, V, huge) and counts outside [0, G].
    bad = torch.tensor([-7, 9, 2**40, -1])[torch.randint(0, 4, ids.shape, generator=gen)]
    ids = torch.where(torch.rand(ids.shape, generator=gen) < 0.3, bad, ids)
    n = torch.tensor([-3, 0, 1, 2, 3, 4, 5, 9] * 2)
    return ids, p_d, p_t, n


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_draft", [True, False])
def test_unchecked_paths_agree_and_reject_bad_ids(seed: int, with_draft: bool) -> None:
    ids, p_d, p_t, n = _corrupt(seed)
    draft = p_d if with_draft else None
    results = []
    for use_triton in (False, True):
        dev = triton_device() if use_triton else "cpu"
        res = dk.speculative_verify(
            ids.to(dev), None if draft is None else draft.to(dev), p_t.to(dev), n.to(dev),
            generator=torch.Generator(device=dev).manual_seed(seed), use_triton=use_triton,
            check_values=False,
        )  # fmt: skip
        results.append(tuple(t.cpu() for t in res))
    (out, acc, emit), other = results
    for a, b in zip(results[0], other):
        assert torch.equal(a, b)
    assert bool(((out >= -1) & (out < 9)).all())  # no bad id is ever emitted
    n_eff = n.clamp(0, 4)
    assert bool((acc <= n_eff).all()) and torch.equal(emit, acc + 1)
    for b in range(16):
        k = int(acc[b])
        assert bool(((ids[b, :k] >= 0) & (ids[b, :k] < 9)).all())


@pytest.mark.parametrize("seed", [0, 1])
def test_unchecked_greedy_paths_agree(seed: int) -> None:
    ids, _, p_t, n = _corrupt(seed)
    logits = torch.log(p_t)
    results = []
    for use_triton in (False, True):
        dev = triton_device() if use_triton else "cpu"
        res = dk.greedy_verify(
            ids.to(dev), logits.to(dev), n.to(dev), use_triton=use_triton, check_values=False
        )
        results.append(tuple(t.cpu() for t in res))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert bool(((results[0][0] >= -1) & (results[0][0] < 9)).all())
