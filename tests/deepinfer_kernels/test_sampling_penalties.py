"""``apply_penalties`` and ``apply_token_bitmask`` against their readable references."""

from __future__ import annotations

import pytest
import torch
from _stats import assert_matches
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import (
    apply_penalties_reference,
    apply_token_bitmask_reference,
    sampling_probs_reference,
)
from deepinfer_kernels.sampling import pad_token_ids, unpack_bitmask

DTYPES = {torch.float32: 0.0, torch.bfloat16: 1e-6, torch.float16: 1e-6}


@st.composite
def penalty_cases(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    batch = draw(st.integers(1, 5))
    vocab = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    ids = st.lists(st.integers(0, vocab - 1), max_size=12)
    prompt = pad_token_ids([draw(ids) for _ in range(batch)])
    output = pad_token_ids([draw(ids) for _ in range(batch)])
    pen = st.floats(-2, 2, allow_nan=False)
    presence = torch.tensor([draw(pen) for _ in range(batch)])
    frequency = torch.tensor([draw(pen) for _ in range(batch)])
    repetition = torch.tensor([draw(st.floats(0.1, 3.0)) for _ in range(batch)])
    # Logits of both signs, exact zeros included (repetition treats 0 as "not positive").
    logits = torch.randn(batch, vocab, generator=gen) * 3
    logits[logits.abs() < 0.2] = 0.0
    return logits, prompt, output, presence, frequency, repetition


@settings(max_examples=30, deadline=None)
@given(case=penalty_cases(), dtype=st.sampled_from(list(DTYPES)))
def test_penalties_match_reference(case: tuple[torch.Tensor, ...], dtype: torch.dtype) -> None:
    logits, *rest = case
    x = logits.to(dtype)
    got = dk.apply_penalties(x, *rest)
    want = apply_penalties_reference(x, *rest)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    assert torch.equal(x, logits.to(dtype)), "the input logits must not change"


def test_penalties_worked_example() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    got = dk.apply_penalties(
        logits,
        prompt_ids=torch.tensor([[1, -1]]),
        output_ids=torch.tensor([[3, 3, 2]]),
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=2.0,
    )
    # token 0: untouched; 1: prompt only, negative -> * 2; 2: once in output: 0.5/2 - 0.25 - 0.5;
    # 3: twice: 3/2 - 0.5 - 0.5.
    torch.testing.assert_close(got, torch.tensor([[2.0, -2.0, -0.5, 0.5]]))


def test_penalties_off_is_identity_and_empty_histories() -> None:
    logits = torch.randn(3, 17)
    empty = torch.empty(3, 0, dtype=torch.int64)
    assert torch.equal(dk.apply_penalties(logits, empty, empty), logits)
    ids = torch.tensor([[1, 2], [3, -1], [-1, -1]])
    assert torch.equal(dk.apply_penalties(logits, ids, ids, 0.0, 0.0, 1.0), logits)


def test_penalties_errors_name_the_argument() -> None:
    logits = torch.randn(2, 8)
    ids = torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="output_ids"):
        dk.apply_penalties(logits, ids, torch.tensor([[8], [0]]))
    with pytest.raises(ValueError, match="prompt_ids"):
        dk.apply_penalties(logits, torch.zeros(3, 1, dtype=torch.int64), ids)
    with pytest.raises(TypeError, match="output_ids"):
        dk.apply_penalties(logits, ids, torch.zeros(2, 1))
    with pytest.raises(ValueError, match="repetition_penalty"):
        dk.apply_penalties(logits, ids, ids, repetition_penalty=0.0)
    with pytest.raises(ValueError, match="presence_penalty"):
        dk.apply_penalties(logits, ids, ids, presence_penalty=torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="logits"):
        dk.apply_penalties(torch.zeros(8), ids, ids)


@st.composite
def mask_cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    batch = draw(st.integers(1, 4))
    vocab = draw(st.integers(1, 100))
    words = -(-vocab // 32) + draw(st.integers(0, 1))  # masks may be wider than the vocabulary
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=gen)
    bits = torch.randint(-(2**31), 2**31, (batch, words), generator=gen, dtype=torch.int64)
    return logits, bits.to(torch.int32)


@settings(max_examples=60, deadline=None)
@given(case=mask_cases())
def test_token_bitmask_matches_reference(case: tuple[torch.Tensor, torch.Tensor]) -> None:
    logits, mask = case
    got = dk.apply_token_bitmask(logits, mask)
    torch.testing.assert_close(got, apply_token_bitmask_reference(logits, mask))
    allowed = unpack_bitmask(mask, logits.shape[1])
    assert torch.equal(torch.isfinite(got), allowed)


def test_token_bitmask_edges() -> None:
    logits = torch.zeros(2, 33)
    mask = torch.zeros(2, 2, dtype=torch.int32)
    mask[0, 0] = -(2**31)  # bit 31: token 31 only
    mask[1, 1] = 1  # token 32 only (the second word)
    got = dk.apply_token_bitmask(logits, mask)
    assert torch.isfinite(got[0]).nonzero().flatten().tolist() == [31]
    assert torch.isfinite(got[1]).nonzero().flatten().tolist() == [32]
    with pytest.raises(ValueError, match="bitmask"):
        dk.apply_token_bitmask(logits, torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(TypeError, match="bitmask"):
        dk.apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int64))
    # A row with nothing allowed is all -inf, which ``sample`` refuses rather than guessing.
    with pytest.raises(ValueError, match="entirely -inf"):
        dk.sample(dk.apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int32)), 1.0, 0, 1.0)


def test_ops_opcheck() -> None:
    # The op's schema and its fake (shapes and dtypes under FakeTensor) against the real op.
    # opcheck's AOT-dispatch test (a torch.compile pass) costs ~10 s here and is left out.
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    ops = torch.ops.deepinfer
    logits = torch.randn(3, 20)
    ids = torch.tensor([[1, 2, -1], [4, 4, 4], [-1, -1, -1]])
    rows = (torch.full((3,), 0.5), torch.full((3,), 0.2), torch.full((3,), 1.3))
    torch.library.opcheck(ops.apply_penalties.default, (logits, ids, ids, *rows), test_utils=utils)
    mask = torch.tensor([[0x0F0F0], [-1], [5]], dtype=torch.int32)
    torch.library.opcheck(ops.apply_token_bitmask.default, (logits, mask), test_utils=utils)


@pytest.mark.parametrize("penalties", [(0.8, 0.0, 1.0), (0.0, 0.6, 1.0), (0.0, 0.0, 1.8)])
def test_sampling_after_penalties_matches_reference_distribution(
    penalties: tuple[float, float, float],
) -> None:
    """Chi-square: tokens drawn from penalised logits follow the reference sampler's law."""
    vocab, draws = 12, 6000
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(1, vocab, generator=gen) * 1.5
    prompt, output = torch.tensor([[0, 1, 2]]), torch.tensor([[3, 3, 4, 1]])
    presence, frequency, repetition = (torch.tensor([v]) for v in penalties)
    penalised = dk.apply_penalties(logits, prompt, output, presence, frequency, repetition)
    params = (torch.full((draws,), 0.9), torch.zeros(draws, dtype=torch.int64), torch.ones(draws))
    tokens = dk.sample(penalised.expand(draws, vocab), *params, generator=gen)
    ref_logits = apply_penalties_reference(logits, prompt, output, presence, frequency, repetition)
    want = sampling_probs_reference(ref_logits, *(p[:1] for p in params), torch.zeros(1))[0]
    assert_matches(tokens, want)
    unpenalised = sampling_probs_reference(logits, *(p[:1] for p in params), torch.zeros(1))[0]
    assert not torch.allclose(want, unpenalised, atol=1e-2), "the penalty must change the law"


def test_sampling_under_a_mask_matches_the_renormalised_distribution() -> None:
    vocab, draws = 40, 6000
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(1, vocab, generator=gen)
    mask = torch.tensor([[0x5555_5555, 0x0F]], dtype=torch.int32)  # even ids < 32, 32..35
    masked = dk.apply_token_bitmask(logits, mask)
    tokens = dk.sample(masked.expand(draws, vocab), 1.0, 0, 1.0, generator=gen)
    allowed = unpack_bitmask(mask, vocab)[0]
    want = torch.where(allowed, torch.softmax(logits[0], -1), 0.0)
    assert_matches(tokens, want / want.sum())
