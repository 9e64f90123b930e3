"""``build_step_inputs`` and ``DecodeInputBuffers``: the step's tensors, as
``AttentionMetadata.build`` and the flat token / position lists define them; and the tokens
``Sequence.ids_between`` reads for a step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.engine.outputs import RequestMetrics
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import Sequence
from deepinfer.engine.step_inputs import (
    MAX_VERIFY_TOKENS,
    DecodeInputBuffers,
    StepInputs,
    VerifyInputBuffers,
    build_step_inputs,
)
from deepinfer.models.attention_metadata import AttentionMetadata

BLOCK = 4


@st.composite
def batches(draw: st.DrawFn, decode: bool) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """Per sequence: its blocks (at least enough for its tokens, maybe more), start, tokens."""
    rows = draw(st.integers(1, 5))
    tables, starts, tokens = [], [], []
    for _ in range(rows):
        start = draw(st.integers(0, 30))
        count = 1 if decode else draw(st.integers(1, 9))
        need = -(-(start + count) // BLOCK)
        extra = draw(st.integers(0, 2))
        tables.append(
            draw(st.lists(st.integers(0, 99), min_size=need + extra, max_size=need + extra))
        )
        starts.append(start)
        tokens.append(draw(st.lists(st.integers(0, 500), min_size=count, max_size=count)))
    return tables, starts, tokens


def _assert_matches_build(
    got: StepInputs, tables: list[list[int]], starts: list[int], tokens: list[list[int]]
) -> None:
    want = AttentionMetadata.build(
        tables,
        seq_lens=[s + len(t) for s, t in zip(starts, tokens)],
        query_lens=[len(t) for t in tokens],
        block_size=BLOCK,
    )
    for name in ("block_table", "seq_lens", "cu_seqlens_q", "slot_mapping"):
        a, b = getattr(got.attn, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
    assert got.input_ids.dtype == got.positions.dtype == torch.int64
    assert got.input_ids.tolist() == [t for toks in tokens for t in toks]
    assert got.positions.tolist() == [
        p for s, toks in zip(starts, tokens) for p in range(s, s + len(toks))
    ]
    assert torch.equal(got.positions, want.positions())
    # The module doc's formula, computed here rather than trusted to either builder.
    assert got.attn.slot_mapping.tolist() == [
        tables[b][p // BLOCK] * BLOCK + p % BLOCK
        for b, (s, toks) in enumerate(zip(starts, tokens))
        for p in range(s, s + len(toks))
    ]
    assert got.num_tokens == sum(len(t) for t in tokens)


@settings(max_examples=60, deadline=None)
@given(batch=batches(decode=False))
def test_build_step_inputs_matches_attention_metadata_build(
    batch: tuple[list[list[int]], list[int], list[list[int]]],
) -> None:
    _assert_matches_build(build_step_inputs(*batch, block_size=BLOCK), *batch)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(batches(decode=True), min_size=1, max_size=6))
def test_decode_buffers_match_build_over_successive_steps(
    steps: list[tuple[list[list[int]], list[int], list[list[int]]]],
) -> None:
    """Successive steps of any shapes (growing, shrinking, another batch size) through one
    buffer set: each step's tensors are exactly what a fresh build gives."""
    buffers = DecodeInputBuffers()
    for batch in steps:
        _assert_matches_build(buffers.fill(*batch, block_size=BLOCK), *batch)


def test_decode_buffers_reuse_tensors_while_the_shape_holds() -> None:
    buffers = DecodeInputBuffers()
    first = buffers.fill([[7, 8]], [4], [[11]], BLOCK)
    second = buffers.fill([[7, 9]], [5], [[12]], BLOCK)
    assert second is first  # same shape: same tensors, new values
    assert second.attn.block_table.tolist() == [[7, 9]]
    assert second.attn.slot_mapping.tolist() == [9 * BLOCK + 1]
    grown = buffers.fill([[7, 9, 3]], [8], [[13]], BLOCK)
    assert grown is not first and grown.attn.block_table.tolist() == [[7, 9, 3]]
    shrunk_row = buffers.fill([[7, 9, 3], [5]], [8, 0], [[1], [2]], BLOCK)
    assert shrunk_row.attn.block_table.tolist() == [[7, 9, 3], [5, 0, 0]]


@pytest.mark.parametrize(
    ("tables", "starts", "tokens", "match"),
    [
        ([[1]], [0, 1], [[1]], "same length"),
        ([[1]], [4], [[1]], "block_tables\\[0\\]"),
        ([[1]], [0], [[]], "tokens\\[0\\]"),
        ([[1]], [-1], [[1]], "starts\\[0\\]"),
    ],
)
def test_build_step_inputs_names_the_bad_argument(
    tables: list[list[int]], starts: list[int], tokens: list[list[int]], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        build_step_inputs(tables, starts, tokens, BLOCK)


@pytest.mark.parametrize(
    ("tables", "starts", "tokens", "match"),
    [
        ([[1]], [0, 1], [[1]], "same length"),
        ([], [], [], "needs sequences"),
        ([[1]], [4], [[1]], "block_tables\\[0\\]"),
        ([[1, 2]], [0], [[1, 2]], "tokens\\[0\\]: a decode step feeds one token"),
    ],
)
def test_decode_buffers_name_the_bad_argument(
    tables: list[list[int]], starts: list[int], tokens: list[list[int]], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        DecodeInputBuffers().fill(tables, starts, tokens, BLOCK)


@st.composite
def verify_steps(draw: st.DrawFn) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """One sequence feeding 1 to MAX_VERIFY_TOKENS tokens (a verification: anchor + drafts)."""
    start = draw(st.integers(0, 40))
    count = draw(st.integers(1, MAX_VERIFY_TOKENS))
    need = -(-(start + count) // BLOCK)
    extra = draw(st.integers(0, 2))
    table = draw(st.lists(st.integers(0, 99), min_size=need + extra, max_size=need + extra))
    return [table], [start], [draw(st.lists(st.integers(0, 500), min_size=count, max_size=count))]


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(verify_steps(), min_size=1, max_size=6))
def test_verify_buffers_match_build_over_successive_steps(
    steps: list[tuple[list[list[int]], list[int], list[list[int]]]],
) -> None:
    """Successive one-sequence steps of any token counts and table widths through one buffer
    set: each step's tensors are exactly what a fresh build gives."""
    buffers = VerifyInputBuffers()
    for batch in steps:
        assert VerifyInputBuffers.takes(batch[2])
        got = buffers.fill(*batch, block_size=BLOCK)
        _assert_matches_build(got, *batch)
        _assert_matches_build(build_step_inputs(*batch, block_size=BLOCK), *batch)


def test_verify_buffers_reuse_tensors_while_the_shape_holds() -> None:
    buffers = VerifyInputBuffers()
    first = buffers.fill([[7, 8]], [3], [[11, 12]], BLOCK)
    second = buffers.fill([[7, 9]], [5], [[13, 14]], BLOCK)
    assert second is first  # same shape: same tensors, new values
    assert second.attn.slot_mapping.tolist() == [9 * BLOCK + 1, 9 * BLOCK + 2]
    assert second.attn.seq_lens.tolist() == [7] and second.positions.tolist() == [5, 6]
    longer = buffers.fill([[7, 9]], [5], [[1, 2, 3]], BLOCK)
    assert longer is not first and longer.attn.cu_seqlens_q.tolist() == [0, 3]
    wider = buffers.fill([[7, 9, 4]], [5], [[1, 2, 3]], BLOCK)
    assert wider is not longer and wider.attn.block_table.tolist() == [[7, 9, 4]]


def test_verify_buffers_take_one_sequence_of_few_tokens() -> None:
    assert VerifyInputBuffers.takes([[1]]) and VerifyInputBuffers.takes([[1] * MAX_VERIFY_TOKENS])
    assert not VerifyInputBuffers.takes([[1] * (MAX_VERIFY_TOKENS + 1)])
    assert not VerifyInputBuffers.takes([[1], [2]])
    assert not VerifyInputBuffers.takes([[]]) and not VerifyInputBuffers.takes([])


@pytest.mark.parametrize(
    ("tables", "starts", "tokens", "block_size", "match"),
    [
        ([[1]], [0, 1], [[1]], BLOCK, "one sequence"),
        ([[1], [2]], [0, 1], [[1], [2]], BLOCK, "one sequence"),
        ([[1]], [0], [[1]], 0, "block_size"),
        ([[1]], [0], [[]], BLOCK, "tokens\\[0\\]"),
        ([[1]], [0], [[1] * (MAX_VERIFY_TOKENS + 1)], 64, "tokens\\[0\\]"),
        ([[1]], [3], [[1, 2]], BLOCK, "block_tables\\[0\\]"),
        ([[1]], [-1], [[1]], BLOCK, "starts\\[0\\]"),
    ],
)
def test_verify_buffers_name_the_bad_argument(
    tables: list[list[int]], starts: list[int], tokens: list[list[int]], block_size: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        VerifyInputBuffers().fill(tables, starts, tokens, block_size)


@settings(max_examples=80)
@given(
    prompt=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    output=st.lists(st.integers(0, 9), max_size=6),
    start=st.integers(0, 14),
    length=st.integers(0, 14),
)
def test_sequence_ids_between_is_a_slice_of_all_ids(
    prompt: list[int], output: list[int], start: int, length: int
) -> None:
    seq = Sequence(0, "r", prompt, SamplingParams(), b"", RequestMetrics(0.0), output_ids=output)
    assert seq.ids_between(start, start + length) == seq.all_ids[start : start + length]
