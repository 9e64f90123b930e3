"""deepinfer_kernels.sampling.grammar: constraints compiled into per-request token masks.

The masks are checked against a brute-force reading of a small byte-level BPE vocabulary: an
allowed token's text keeps the output a prefix of an accepted string, and the tokenizer's own
encoding of every accepted string stays allowed (llguidance may refuse some non-canonical
splits, so the mask is a subset of the prefix tokens, not always all of them). The speculative
``masks_along`` is checked against stepping a fresh matcher token by token.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels import apply_token_bitmask
from deepinfer_kernels.sampling import (
    GrammarCompiler,
    GrammarMatcher,
    StructuredOutputsParams,
    unpack_bitmask,
)

pytest.importorskip("llguidance")
tokenizers = pytest.importorskip("tokenizers")

EOS = 0  # "<eos>" is the trainer's first special token
CORPUS = ["yes no maybe", '{"name": "abc", "age": 12}', "hello world", "yesno noyes"]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<eos>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 5, trainer)
    return tok


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer.to_str(), eos_token_ids=[EOS])


def _allowed(matcher: GrammarMatcher, vocab: int) -> set[int]:
    return set(torch.nonzero(unpack_bitmask(matcher.bitmask()[None], vocab)[0]).flatten().tolist())


def _prefix_tokens(tokenizer: Any, done: str, accepted: list[str]) -> set[int]:
    """Tokens whose text extends ``done`` to a prefix of an accepted string (EOS excluded)."""
    out = set()
    for t in range(1, tokenizer.get_vocab_size()):
        text = tokenizer.decode([t])
        if text and any(a.startswith(done + text) for a in accepted):
            out.add(t)
    return out


def _check_mask(allowed: set[int], tokenizer: Any, done: str, accepted: list[str]) -> None:
    assert allowed <= _prefix_tokens(tokenizer, done, accepted)
    for a in accepted:
        if a.startswith(done) and a != done:
            assert tokenizer.encode(a[len(done) :]).ids[0] in allowed, a


def test_choice_mask_is_the_prefixes_of_the_choices(tokenizer: Any, compiler: Any) -> None:
    choices = ["yes", "no", "maybe"]
    matcher = compiler.matcher(StructuredOutputsParams(choice=choices))
    vocab = tokenizer.get_vocab_size()
    assert matcher.bitmask().dtype == torch.int32
    assert matcher.bitmask().shape == (-(-vocab // 32),)
    _check_mask(_allowed(matcher, vocab), tokenizer, "", choices)
    # Walk "maybe" token by token: the mask follows the text emitted so far.
    done = ""
    for t in tokenizer.encode("maybe").ids:
        assert t in _allowed(matcher, vocab)
        assert matcher.advance(t)
        done += tokenizer.decode([t])
        if done != "maybe":
            _check_mask(_allowed(matcher, vocab), tokenizer, done, choices)
    assert _allowed(matcher, vocab) == {EOS}  # a finished grammar allows only EOS


def test_a_token_the_grammar_forbids_is_refused(tokenizer: Any, compiler: Any) -> None:
    matcher = compiler.matcher(StructuredOutputsParams(regex=r"(yes|no)+"))
    hello = tokenizer.encode("hello").ids[0]
    assert not matcher.try_advance(hello)  # refused, nothing consumed
    yes = tokenizer.encode("yes").ids
    assert all(matcher.try_advance(t) for t in yes)
    matcher.rollback(len(yes))
    _check_mask(_allowed(matcher, tokenizer.get_vocab_size()), tokenizer, "", ["yesno", "noyes"])
    assert not matcher.advance(hello)


@given(drafts=st.lists(st.sampled_from(["yes", "no", "hello", " ", "y", "es"]), max_size=5))
@settings(max_examples=25, deadline=None)
def test_masks_along_equals_stepping_a_fresh_matcher(
    tokenizer: Any, compiler: Any, drafts: list[str]
) -> None:
    params = StructuredOutputsParams(regex=r"(yes|no)( (yes|no))*")
    ids = [tid for text in drafts for tid in tokenizer.encode(text).ids][:5]
    positions = len(ids) + 1
    matcher = compiler.matcher(params)
    before = matcher.bitmask()
    got = matcher.masks_along(ids, positions)
    # Reference: step a fresh matcher; once a draft is refused (or drafts run out), the
    # remaining positions repeat the last live mask.
    fresh = compiler.matcher(params)
    want: list[torch.Tensor] = []
    live = True
    for j in range(positions):
        want.append(fresh.bitmask() if live else want[-1])
        if live:
            live = j < len(ids) and j + 1 < positions and fresh.try_advance(ids[j])
    assert torch.equal(got, torch.stack(want))
    assert torch.equal(matcher.bitmask(), before)  # the matcher ends where it started


def test_the_mask_applied_to_logits_only_leaves_allowed_tokens(
    tokenizer: Any, compiler: Any
) -> None:
    vocab = tokenizer.get_vocab_size()
    matcher = compiler.matcher(StructuredOutputsParams(choice=["no"]))
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    out = apply_token_bitmask(logits, matcher.bitmask()[None])
    finite = set(torch.nonzero(torch.isfinite(out[0])).flatten().tolist())
    assert finite == _allowed(matcher, vocab)
    _check_mask(finite, tokenizer, "", ["no"])
    assert torch.equal(out[0][list(finite)], logits[0][list(finite)])


def test_rows_past_the_tokenizer_are_disallowed(tokenizer: Any) -> None:
    vocab = tokenizer.get_vocab_size()
    wide = GrammarCompiler(tokenizer.to_str(), eos_token_ids=[EOS], vocab_size=vocab + 40)
    matcher = wide.matcher(StructuredOutputsParams(json_object=True))
    mask = unpack_bitmask(matcher.bitmask()[None], vocab + 40)[0]
    assert matcher.bitmask().shape == (-(-(vocab + 40) // 32),)
    assert mask[:vocab].any() and not mask[vocab:].any()


def test_json_schema_output_is_valid_json_of_that_shape(tokenizer: Any, compiler: Any) -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    matcher = compiler.matcher(StructuredOutputsParams(json=schema))
    for t in tokenizer.encode('{"age": 12}').ids:
        assert matcher.advance(t)
    assert _allowed(matcher, tokenizer.get_vocab_size()) >= {EOS}
    assert not matcher.try_advance(tokenizer.encode('"').ids[0])  # the object is closed


def test_bad_constraints_and_arguments_name_the_field(compiler: Any) -> None:
    with pytest.raises(ValueError, match=r"structured_outputs\.regex"):
        compiler.matcher(StructuredOutputsParams(regex="[a-"))
    with pytest.raises(ValueError, match=r"structured_outputs\.grammar"):
        compiler.matcher(StructuredOutputsParams(grammar="start: undefined_rule"))
    with pytest.raises(TypeError, match="tokenizer_json"):
        GrammarCompiler("")
    with pytest.raises(ValueError, match="vocab_size"):
        GrammarCompiler("{}", vocab_size=0)
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])


def test_params_cross_a_process_as_json() -> None:
    params = StructuredOutputsParams(json={"type": "object"})
    assert params.kind == "json"
    again = StructuredOutputsParams(**params.to_json_dict())
    assert again == params
    assert StructuredOutputsParams(choice=["a", "b"]).choice == ("a", "b")
