"""Tokenizer built from GGUF metadata, tokenizer.json round trip, streaming detokenisation, chat templates."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import random_hf_state, tiny_config, tiny_vocab, write_tiny_gguf

from deepinfer.models import ChatTemplate, ChatTemplateError, Tokenizer
from deepinfer.models.gguf_loader import open_gguf


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    cfg = tiny_config(num_layers=1)
    path = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "t.gguf", cfg, random_hf_state(cfg))
    return Tokenizer.from_gguf(open_gguf(path))


def test_gguf_tokenizer_applies_merges_and_specials(tok: Tokenizer) -> None:
    tokens, _ = tiny_vocab()
    ids = tok.encode("<|im_start|>the the heat")
    assert ids[0] == 1  # the special token is one id, not split into characters
    pieces = [tokens[i] for i in ids[1:]]
    # Merges apply in rank order: "Ġ t", "h e", then "Ġt he"; there is no "Ġ he".
    assert pieces == ["t", "he", "Ġthe", "Ġ", "he", "at"]
    assert tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    assert tok.vocab_size == len(tokens)


def test_digits_are_split_one_by_one(tok: Tokenizer) -> None:
    tokens, _ = tiny_vocab()
    assert [tokens[i] for i in tok.encode("x123")] == ["x", "1", "2", "3"]


text_st = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), max_codepoint=0x1F600), max_size=40
)


@settings(max_examples=25)
@given(text=text_st)
def test_encode_decode_round_trip(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=25)
@given(text=text_st)
def test_incremental_detokenizer_concatenates_to_full_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    stream = tok.detokenizer()
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == tok.decode(ids)
    assert not any("\ufffd" in p for p in pieces)  # never emits half a character


def test_incremental_detokenizer_holds_back_split_characters(tok: Tokenizer) -> None:
    ids = tok.encode("é")  # two bytes, two byte-level tokens here
    assert len(ids) == 2
    stream = tok.detokenizer()
    assert stream.push(ids[0]) == ""
    assert stream.push(ids[1]) == "é"


def test_special_tokens_skipped_on_decode_unless_asked(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<|im_end|>"


def test_save_and_reload_gives_same_ids(tok: Tokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path, chat_template="{{ 'x' }}")
    again = Tokenizer.from_file(tmp_path / "tokenizer.json")
    text = "the rain in 2024, <|im_end|> ünïcödé"
    assert again.encode(text) == tok.encode(text)
    assert again.bos_token_id == tok.bos_token_id and again.eos_token_ids == tok.eos_token_ids


def test_add_bos(tok: Tokenizer) -> None:
    assert tok.encode("a", add_bos=True)[0] == tok.bos_token_id
    assert tok.encode("a")[0] != tok.bos_token_id


def test_tokenizer_input_errors(tok: Tokenizer, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="text"):
        tok.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.from_file(tmp_path / "nope.json")


# ---------------------------------------------------------------------- chat templates
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_chat_template_renders_messages_and_generation_prompt() -> None:
    tpl = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}",
        bos_token="<s>",
    )
    assert tpl.render(MESSAGES) == "<s>[system]Be brief.\n[user]Hi\n[assistant]"
    assert tpl.render(MESSAGES, add_generation_prompt=False).endswith("Hi\n")


def test_chat_template_fallback_is_chatml() -> None:
    tpl = ChatTemplate(None)
    assert tpl.is_fallback
    out = tpl.render(MESSAGES)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_raise_exception_and_sandbox() -> None:
    strict = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="user first"):
        strict.render(MESSAGES)
    # The sandbox refuses to reach Python internals from a template.
    escape = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        escape.render(MESSAGES)
    with pytest.raises(ChatTemplateError, match="compile"):
        ChatTemplate("{% for %}")


def test_chat_template_validates_messages() -> None:
    tpl = ChatTemplate(None)
    with pytest.raises(ValueError, match="at least one"):
        tpl.render([])
    with pytest.raises(ValueError, match=r"messages\[0\]\['content'\]"):
        tpl.render([{"role": "user", "content": 3}])
