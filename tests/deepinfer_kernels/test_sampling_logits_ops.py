"""``gather_logprobs`` and ``apply_logit_bias`` against their readable references;
``sample_with_generators`` against the ``sample`` calls it stands for."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import apply_logit_bias_reference, gather_logprobs_reference
from deepinfer_kernels.sampling import (
    pad_token_ids,
    sample_with_generators,
    token_bitmask,
    unpack_bitmask,
)

# Per input dtype: how far the float32 results may sit from the reference (the op and the
# reference both widen to float32 first, so every dtype matches exactly).
TOL = {torch.float32: 0.0, torch.bfloat16: 0.0, torch.float16: 0.0}


@st.composite
def logprob_cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, int]:
    rows = draw(st.integers(0, 5))
    vocab = draw(st.integers(1, 60))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    # Few distinct values, so ties (inside and at the edge of the top-k) are common.
    levels = draw(st.integers(1, 8))
    logits = torch.randint(0, levels, (rows, vocab), generator=gen).float()
    lp = torch.log_softmax(logits, dim=-1)
    if rows and draw(st.booleans()):
        lp[0, torch.randint(0, vocab, (vocab // 2 + 1,), generator=gen)] = float("-inf")
    ids = torch.randint(0, vocab, (rows,), generator=gen)
    return lp, ids, draw(st.integers(0, vocab + 3))


@settings(max_examples=30, deadline=None)
@given(case=logprob_cases(), dtype=st.sampled_from(list(TOL)))
def test_gather_logprobs_matches_reference(
    case: tuple[torch.Tensor, torch.Tensor, int], dtype: torch.dtype
) -> None:
    lp, ids, k = case
    x = lp.to(dtype)
    got = dk.gather_logprobs(x, ids, k)
    want = gather_logprobs_reference(x, ids, k)
    assert [t.dtype for t in got] == [torch.float32, torch.int64, torch.int64, torch.float32]
    assert got[2].shape == (lp.shape[0], min(k, lp.shape[1]))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=TOL[dtype])


def test_gather_logprobs_worked_example_and_nan_rows() -> None:
    lp = torch.tensor([[-1.0, -0.5, -1.0, -3.0], [float("nan")] * 4])
    chosen, rank, top_ids, top_lp = dk.gather_logprobs(lp, torch.tensor([2, 1]), 3)
    # Row 0: token 2 (-1.0) has one token above it: rank 2; the tie -1.0 orders 0 before 2.
    assert chosen[0] == -1.0 and rank.tolist() == [2, 1]
    assert top_ids[0].tolist() == [1, 0, 2]
    assert top_lp[0].tolist() == [-0.5, -1.0, -1.0]
    assert top_ids[1].tolist() == [0, 1, 2]  # all NaN: id order, as a stable sort gives


def test_gather_logprobs_errors_name_the_argument() -> None:
    lp = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="token_ids"):
        dk.gather_logprobs(lp, torch.tensor([0, 5]), 1)
    with pytest.raises(ValueError, match="token_ids"):
        dk.gather_logprobs(lp, torch.tensor([0]), 1)
    with pytest.raises(TypeError, match="token_ids"):
        dk.gather_logprobs(lp, torch.tensor([0.0, 1.0]), 1)
    with pytest.raises(ValueError, match="num_top"):
        dk.gather_logprobs(lp, torch.tensor([0, 1]), -1)
    with pytest.raises(ValueError, match="logprobs"):
        dk.gather_logprobs(torch.zeros(5), torch.tensor([0]), 1)


@st.composite
def bias_cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch = draw(st.integers(1, 5))
    vocab = draw(st.integers(1, 40))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    # Repeated ids are allowed: each occurrence adds its amount.
    ids = pad_token_ids(
        [draw(st.lists(st.integers(0, vocab - 1), max_size=8)) for _ in range(batch)]
    )
    amount = st.one_of(st.floats(-100, 100, allow_nan=False), st.just(float("-inf")))
    bias = torch.tensor([[draw(amount) for _ in range(ids.shape[1])] for _ in range(batch)])
    bias = bias.reshape(ids.shape).float()
    return torch.randn(batch, vocab, generator=gen) * 3, ids, bias


@settings(max_examples=60, deadline=None)
@given(case=bias_cases(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_logit_bias_matches_reference(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor], dtype: torch.dtype
) -> None:
    logits, ids, bias = case
    x = logits.to(dtype)
    got = dk.apply_logit_bias(x, ids, bias)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    # Sums of several amounts may round in another order than the reference's.
    torch.testing.assert_close(got, apply_logit_bias_reference(x, ids, bias), rtol=1e-6, atol=1e-4)
    assert torch.equal(x, logits.to(dtype)), "the input logits must not change"


def test_logit_bias_edges_and_errors() -> None:
    logits = torch.zeros(2, 4)
    out = dk.apply_logit_bias(
        logits, torch.tensor([[1, 1], [-1, -1]]), torch.tensor([[0.5, 2.0], [9.0, 9.0]])
    )
    assert out.tolist() == [[0.0, 2.5, 0.0, 0.0], [0.0] * 4]  # pads add nothing
    empty = torch.empty(2, 0, dtype=torch.int64)
    assert torch.equal(dk.apply_logit_bias(logits, empty, torch.empty(2, 0)), logits)
    with pytest.raises(ValueError, match="token_ids"):
        dk.apply_logit_bias(logits, torch.tensor([[4], [0]]), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="token_ids"):
        dk.apply_logit_bias(logits, torch.tensor([[0]]), torch.zeros(1, 1))
    with pytest.raises(ValueError, match="bias"):
        dk.apply_logit_bias(logits, torch.tensor([[0], [0]]), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="bias"):
        dk.apply_logit_bias(logits, torch.tensor([[0], [0]]), torch.zeros(2, 1, dtype=torch.int64))


@settings(max_examples=40, deadline=None)
@given(vocab=st.integers(1, 100), data=st.data())
def test_token_bitmask_allows_exactly_the_ids(vocab: int, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(-3, vocab + 40), max_size=20))
    mask = token_bitmask(ids, vocab)
    assert mask.dtype == torch.int32 and mask.shape == (-(-vocab // 32),)
    allowed = unpack_bitmask(mask[None], vocab)[0]
    assert allowed.nonzero().flatten().tolist() == sorted({t for t in ids if 0 <= t < vocab})


def test_ops_opcheck() -> None:
    # Schema and fake (shapes and dtypes under FakeTensor) against the real ops.
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    ops = torch.ops.deepinfer
    lp = torch.log_softmax(torch.randn(3, 20), dim=-1)
    ids = torch.tensor([1, 4, 19])
    torch.library.opcheck(ops.gather_logprobs.default, (lp, ids, 5), test_utils=utils)
    bias_ids = torch.tensor([[1, 2, -1], [4, 4, 4], [-1, -1, -1]])
    torch.library.opcheck(
        ops.apply_logit_bias.default, (lp, bias_ids, torch.randn(3, 3)), test_utils=utils
    )


@settings(max_examples=25, deadline=None)
@given(
    seeded=st.lists(st.booleans(), min_size=1, max_size=5),
    greedy=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sample_with_generators_matches_sample_per_group(
    seeded: list[bool], greedy: bool, seed: int
) -> None:
    # Unseeded rows draw together from the shared stream, in row order; each seeded row draws
    # alone from its own: exactly the ``sample`` calls that split would make.
    rows, vocab = len(seeded), 30
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    temp = torch.full((rows,), 0.0 if greedy else 0.9)
    params = (temp, torch.full((rows,), 7), torch.full((rows,), 0.9), torch.zeros(rows))
    gens = [torch.Generator().manual_seed(seed + i) if s else None for i, s in enumerate(seeded)]
    got = sample_with_generators(logits, *params, gens, torch.Generator().manual_seed(seed + 99))
    want = [0] * rows
    shared = torch.Generator().manual_seed(seed + 99)
    plain = [i for i, s in enumerate(seeded) if not s]
    groups = ([(plain, shared)] if plain else []) + [
        ([i], torch.Generator().manual_seed(seed + i)) for i, s in enumerate(seeded) if s
    ]
    for idx, gen in groups:
        drawn = dk.sample(logits[idx], *(p[idx] for p in params), generator=gen)
        for i, t in zip(idx, drawn.tolist()):
            want[i] = t
    assert got == want
    if greedy:
        assert got == logits.argmax(dim=-1).tolist()


def test_sample_with_generators_refuses_a_wrong_generator_count_and_bad_rows() -> None:
    logits = torch.zeros(2, 4)
    params = (torch.zeros(2), torch.zeros(2, dtype=torch.int64), torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError, match="generators"):
        sample_with_generators(logits, *params, [None], torch.Generator())
    logits[1, 0] = float("nan")  # greedy rows with NaN take sample's path and its error
    with pytest.raises(ValueError, match=r"NaN|nan"):
        sample_with_generators(logits, *params, [None, None], torch.Generator())
