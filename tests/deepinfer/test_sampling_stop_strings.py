"""Stop strings on detokenised text: across token boundaries, inside tokens, while streaming."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer.engine.output_processor import OutputProcessor
from deepinfer.engine.outputs import RequestMetrics
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import Sequence
from deepinfer.engine.stop_strings import StopStringMatcher
from deepinfer.models import Tokenizer
from deepinfer.models.gguf_loader import open_gguf


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    cfg = tiny_config(num_layers=1)
    path = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "t.gguf", cfg, random_hf_state(cfg))
    return Tokenizer.from_gguf(open_gguf(path))


def _seq(params: SamplingParams) -> Sequence:
    return Sequence(0, "r", [5], params, b"", RequestMetrics(0.0))


def _run(
    tok: Tokenizer, ids: list[int], params: SamplingParams, block: int = 1
) -> tuple[Sequence, list[str], str | None, int]:
    """Feed ``ids`` ``block`` at a time; the streamed pieces, the finish reason and how many
    tokens were kept."""
    proc = OutputProcessor(tok, max_model_len=10_000)
    seq = _seq(params)
    proc.track(seq)
    pieces: list[str] = []
    reason = None
    for start in range(0, len(ids), block):
        _, text, reason = proc.append(seq, ids[start : start + block])
        pieces.append(text)
        if reason is not None:
            break
    return seq, pieces, reason, len(seq.output_ids)


TEXT = st.text(alphabet="the at on re sin\n", min_size=1, max_size=40)


@settings(max_examples=80, deadline=None)
@given(text=TEXT, data=st.data(), block=st.integers(1, 4), include=st.booleans())
def test_stop_string_cuts_at_first_match(
    tok: Tokenizer, text: str, data: st.DataObject, block: int, include: bool
) -> None:
    ids = tok.encode(text)
    full = tok.decode(ids)
    start = data.draw(st.integers(0, len(full) - 1))
    stop = full[start : start + data.draw(st.integers(1, 4))]
    params = SamplingParams(
        max_tokens=1000, stop=[stop], include_stop_str_in_output=include, ignore_eos=True
    )
    seq, pieces, reason, kept = _run(tok, ids, params, block)
    at = full.find(stop)
    want = full[: at + len(stop)] if include else full[:at]
    assert seq.text == want
    assert "".join(pieces) == want  # streaming never released text that was later cut
    assert reason == "stop" and seq.state is not None and seq.state.stop_reason == stop
    # Tokens stop at the one that completed the match (the rest are not generated).
    assert tok.decode(ids[:kept]).find(stop) >= 0
    assert kept == len(ids) or tok.decode(ids[: kept - 1]).find(stop) < 0


@settings(max_examples=40, deadline=None)
@given(text=TEXT, block=st.integers(1, 3))
def test_no_match_streams_everything(tok: Tokenizer, text: str, block: int) -> None:
    ids = tok.encode(text)
    params = SamplingParams(max_tokens=len(ids), stop=["zz", "qq"], ignore_eos=True)
    seq, pieces, reason, kept = _run(tok, ids, params, block)
    assert reason == "length" and kept == len(ids)
    assert "".join(pieces) == seq.text == tok.decode(ids)


def test_stop_string_spanning_tokens_is_held_back_while_streaming(tok: Tokenizer) -> None:
    ids = tok.encode("the heat")
    assert len(ids) >= 3
    params = SamplingParams(max_tokens=len(ids), stop=["he hi"], ignore_eos=True)
    _, pieces, reason, _ = _run(tok, ids, params)
    # "he" could start "he hi" until "heat" proves otherwise; then everything is released.
    assert reason == "length" and "".join(pieces) == "the heat"
    assert pieces[0] == "t"  # "he" of "the" was held back


def test_matcher_holds_partial_prefix_and_releases_it() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.push("abc ST") == ("abc ", None)
    assert m.push("O") == ("", None)
    assert m.push("x") == ("STOx", None)
    assert m.push("yST") == ("y", None)
    assert m.flush() == "ST"


def test_matcher_earliest_of_several_and_inside_one_piece() -> None:
    m = StopStringMatcher(["cd", "b"], include_in_output=True)
    assert m.push("abcd") == ("ab", "b")
    assert m.push("more") == ("", "b")


def test_min_tokens_defers_stop_strings_and_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("the at the at")
    first = tok.decode(ids[:1])
    params = SamplingParams(max_tokens=100, stop=[first], min_tokens=2, ignore_eos=True)
    seq, _, reason, kept = _run(tok, ids, params)
    assert kept >= 2 and reason == "stop"  # the first token's text did not stop it
    stop_id = ids[0]
    params = SamplingParams(max_tokens=100, stop_token_ids=[stop_id], min_tokens=1)
    seq, _, reason, kept = _run(tok, ids, params)
    assert reason == "stop" and kept == ids.index(stop_id, 1) + 1
    assert seq.state is not None and seq.state.stop_reason == stop_id


def test_skip_special_tokens_false_keeps_them(tok: Tokenizer) -> None:
    ids = [*tok.encode("hi"), 1, *tok.encode("x")]  # 1 = <|im_start|>
    for skip, want in ((True, "hix"), (False, "hi<|im_start|>x")):
        params = SamplingParams(max_tokens=len(ids), skip_special_tokens=skip, ignore_eos=True)
        seq, _, _, _ = _run(tok, ids, params)
        assert seq.text == want


def test_stop_needs_a_tokenizer() -> None:
    proc = OutputProcessor(None, max_model_len=100)
    with pytest.raises(ValueError, match="stop needs a tokenizer"):
        proc.track(_seq(SamplingParams(stop="x")))
