"""`process_logits` / `rescue_dead_rows` against the per-row reference (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.reference import process_logits_reference, rescue_dead_rows_reference
from deepinfer_kernels.sampling import RowTransforms, process_logits, rescue_dead_rows


def _boost_last_seen(history: tuple[int, ...], logits: torch.Tensor) -> torch.Tensor:
    """A deterministic processor that depends on the history: +1 on token 0 per id seen."""
    logits[0] = logits[0] + len(history)
    return logits


@st.composite
def _row(draw: st.DrawFn, vocab: int) -> RowTransforms:
    ids = st.integers(0, vocab - 1)
    penalties = draw(st.booleans())
    bias = draw(
        st.none() | st.dictionaries(st.integers(0, vocab + 4), st.floats(-5, 5), max_size=4)
    )
    words = -(-vocab // 32)
    bitmask = None
    if draw(st.booleans()):
        width = draw(st.integers(max(1, words - 1), words + 1))  # narrower, exact or wider
        values = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=width, max_size=width))
        bitmask = torch.tensor(values, dtype=torch.int32)
    return RowTransforms(
        history=draw(st.lists(ids, max_size=6)),  # empty histories included
        prompt_ids=draw(st.lists(ids, max_size=6)),
        presence_penalty=draw(st.floats(-1, 1)) if penalties else 0.0,
        frequency_penalty=draw(st.floats(-1, 1)) if penalties else 0.0,
        repetition_penalty=draw(st.floats(0.5, 2.0)) if penalties else 1.0,
        logit_bias=bias,
        min_tokens=draw(st.integers(0, 4)),
        min_tokens_banned=draw(st.lists(st.integers(0, vocab + 2), max_size=3)),
        allowed_token_ids=draw(st.none() | st.lists(ids, min_size=1, max_size=5)),
        bitmask=bitmask,
        processors=draw(st.sampled_from([(), (_boost_last_seen,)])),
    )


@st.composite
def _case(draw: st.DrawFn) -> tuple[torch.Tensor, list[RowTransforms]]:
    # Vocabularies not a multiple of 8 (or of 32) included; every row drawn on its own.
    vocab = draw(st.sampled_from([1, 7, 33, 50, 64, 67]))
    n = draw(st.integers(1, 5))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    seed = draw(st.integers(0, 2**16))
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    return logits.to(dtype), [draw(_row(vocab)) for _ in range(n)]


@settings(max_examples=60, deadline=None)
@given(_case())
def test_pipeline_matches_the_per_row_reference(
    case: tuple[torch.Tensor, list[RowTransforms]],
) -> None:
    logits, rows = case
    before = logits.clone()
    out = process_logits(logits, rows)
    assert out.dtype == torch.float32 and out.shape == logits.shape
    torch.testing.assert_close(out, process_logits_reference(logits, rows), rtol=1e-5, atol=1e-5)
    assert torch.equal(logits, before)  # the input is not modified


def test_rows_without_transforms_are_returned_unchanged() -> None:
    logits = torch.randn(3, 67, dtype=torch.bfloat16)
    rows = [RowTransforms(), RowTransforms(history=[1, 2], prompt_ids=[3]), RowTransforms()]
    assert torch.equal(process_logits(logits, rows), logits.float())


def test_min_tokens_bans_until_the_history_is_long_enough() -> None:
    logits = torch.zeros(2, 10)
    banned = RowTransforms(history=[4], min_tokens=2, min_tokens_banned=[9, 3])
    done = RowTransforms(history=[4, 4], min_tokens=2, min_tokens_banned=[9, 3])
    out = process_logits(logits, [banned, done])
    assert out[0, 9] == out[0, 3] == float("-inf") and torch.isfinite(out[0, :3]).all()
    assert torch.isfinite(out[1]).all()


def test_a_narrow_grammar_mask_bans_the_tokens_past_it() -> None:
    mask = torch.tensor([-1], dtype=torch.int32)  # all of the first 32 tokens allowed
    out = process_logits(torch.zeros(1, 40), [RowTransforms(bitmask=mask)])
    assert torch.isfinite(out[0, :32]).all() and (out[0, 32:] == float("-inf")).all()


def test_rescue_dead_rows_allows_only_the_fallback() -> None:
    logits = torch.randn(4, 9)
    logits[1] = float("-inf")
    logits[3] = float("nan")
    expected, expected_dead = rescue_dead_rows_reference(logits, [5, 6, 7, None])
    dead = rescue_dead_rows(logits, [5, 6, 7, None])
    assert dead == expected_dead == [1, 3]
    torch.testing.assert_close(logits, expected)
    assert logits[1].argmax() == 6 and logits[3].argmax() == 0
    assert torch.isinf(logits[1]).sum() == 8


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="rows"):
        process_logits(torch.zeros(2, 8), [RowTransforms()])
    with pytest.raises(ValueError, match="logits"):
        process_logits(torch.zeros(8), [RowTransforms()])
    with pytest.raises(ValueError, match="logits_processors"):
        process_logits(torch.zeros(1, 8), [RowTransforms(processors=[lambda h, x: x[:4]])])
    with pytest.raises(TypeError, match="bitmask"):
        RowTransforms(bitmask=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="repetition_penalty"):
        RowTransforms(repetition_penalty=0.0)
    with pytest.raises(ValueError, match="min_tokens"):
        RowTransforms(min_tokens=-1)
    with pytest.raises(ValueError, match="fallback_ids"):
        rescue_dead_rows(torch.zeros(2, 4), [0])


def test_a_plain_function_is_a_logits_processor() -> None:
    from deepinfer_kernels.sampling import LogitsProcessor

    assert isinstance(_boost_last_seen, LogitsProcessor)
    assert not isinstance(3, LogitsProcessor)
