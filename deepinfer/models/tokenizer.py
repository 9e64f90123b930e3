"""`Tokenizer`: a thin wrapper over Hugging Face `tokenizers`, loadable from tokenizer.json or GGUF."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# GGUF pre-tokenizer names whose split is "each digit alone, then GPT-2's byte-level regex".
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "codeshell", "exaone", "minerva-7b"}
# Llama-3 / Qwen2 style split regex, applied before a regex-free byte-level mapping.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4  # llama.cpp token types
_SPIECE_SPACE = "\u2581"  # SentencePiece's visible space


class Tokenizer:
    """Encode/decode text for a model; knows its BOS/EOS ids and whether to prepend BOS.

    Example::

        tok = Tokenizer.from_file("tokenizer.json")
        ids = tok.encode("Hello")
        assert tok.decode(ids) == "Hello"
    """

    def __init__(
        self,
        backend: Any,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        add_bos_token: bool = False,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos_token = add_bos_token
        if add_bos_token and bos_token_id is None:
            raise ValueError("add_bos_token=True needs a bos_token_id")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], config_path: str | os.PathLike[str] | None = None
    ) -> Tokenizer:
        """Load ``tokenizer.json``; BOS/EOS settings come from ``tokenizer_config.json`` beside it
        (or ``config_path``) when present."""
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        if not path.is_file():
            raise ValueError(f"tokenizer file {os.fspath(path)!r} does not exist")
        backend = HFTokenizer.from_file(os.fspath(path))
        meta_path = Path(config_path) if config_path else path.with_name("tokenizer_config.json")
        meta: dict[str, Any] = {}
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text(encoding="utf-8"))

        def token_id(value: Any) -> int | None:
            if isinstance(value, dict):
                value = value.get("content")
            return None if value is None else backend.token_to_id(str(value))

        eos_ids = meta.get("eos_token_ids")
        if eos_ids is None:
            eos = token_id(meta.get("eos_token"))
            eos_ids = [] if eos is None else [eos]
        return cls(
            backend,
            bos_token_id=token_id(meta.get("bos_token")),
            eos_token_ids=[int(i) for i in eos_ids],
            add_bos_token=bool(meta.get("add_bos_token", False)),
        )

    @classmethod
    def from_gguf(cls, reader: Any) -> Tokenizer:
        """Build the tokenizer a GGUF file describes: byte-level BPE (``tokenizer.ggml.model ==
        gpt2``: SmolLM2, Llama-3, Qwen2) or SentencePiece BPE with byte fallback (``llama``:
        Llama-2, Mistral, TinyLlama)."""
        fields = reader.fields

        def get(key: str, default: Any = None) -> Any:
            return fields[key].contents() if key in fields else default

        kind = get("tokenizer.ggml.model")
        if kind == "llama":
            return cls._from_gguf_sentencepiece(get)
        if kind != "gpt2":
            raise ValueError(
                f"GGUF tokenizer.ggml.model {kind!r} is not supported (supported: gpt2 for "
                "byte-level BPE, llama for SentencePiece)"
            )
        return cls._from_gguf_byte_level(get)

    @classmethod
    def _from_gguf_byte_level(cls, get: Any) -> Tokenizer:
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        tokens: list[str] = get("tokenizer.ggml.tokens")
        merges: list[str] = get("tokenizer.ggml.merges", [])
        types: list[int] = get("tokenizer.ggml.token_type", [1] * len(tokens))
        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs: list[tuple[str, str]] = []
        for merge in merges:
            left, _, right = merge.partition(" ")
            pairs.append((left, right))
        backend = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        pre = get("tokenizer.ggml.pre", "default")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in _DIGIT_SPLIT_PRE:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        elif pre in ("llama-bpe", "llama3", "qwen2", "smaug-bpe"):
            regex = _QWEN2_SPLIT if pre == "qwen2" else _LLAMA3_SPLIT
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        specials = [
            AddedToken(tok, special=t == _CONTROL, normalized=False)
            for tok, t in zip(tokens, types)
            if t in (_CONTROL, _USER_DEFINED)
        ]
        backend.add_special_tokens([s for s in specials if s.special])
        backend.add_tokens([s for s in specials if not s.special])
        return cls._with_gguf_specials(backend, get, add_bos_default=False)

    @classmethod
    def _from_gguf_sentencepiece(cls, get: Any) -> Tokenizer:
        """llama.cpp's SPM vocabulary (pieces, scores, types) as a `tokenizers` BPE model.

        SentencePiece BPE merges the adjacent pair whose joined piece scores highest; a BPE
        model whose merge ranks follow the joined pieces' scores does the same (the conversion
        Hugging Face uses for Llama). Spaces become ``▁``, one is prepended to each text
        fragment (``add_space_prefix``), and characters outside the vocabulary fall back to
        ``<0xXX>`` byte pieces.
        """
        from tokenizers import AddedToken, decoders, models, normalizers
        from tokenizers import Tokenizer as HFTokenizer

        tokens: list[str] = get("tokenizer.ggml.tokens")
        scores: list[float] = get("tokenizer.ggml.scores", [0.0] * len(tokens))
        types: list[int] = get("tokenizer.ggml.token_type", [1] * len(tokens))
        if len(scores) != len(tokens) or len(types) != len(tokens):
            raise ValueError("GGUF tokenizer: tokens, scores and token_type lengths differ")
        vocab = {tok: i for i, tok in enumerate(tokens)}
        mergeable = {tok: float(sc) for tok, sc, t in zip(tokens, scores, types) if t == 1}
        ranked: list[tuple[float, int, int, int, str, str]] = []
        for piece, score in mergeable.items():
            for cut in range(1, len(piece)):
                left, right = piece[:cut], piece[cut:]
                if left in vocab and right in vocab:
                    ranked.append((-score, vocab[piece], vocab[left], vocab[right], left, right))
        ranked.sort()
        unk_ids = [i for i, t in enumerate(types) if t == _UNKNOWN]
        unk = tokens[unk_ids[0]] if unk_ids else None
        backend = HFTokenizer(
            models.BPE(
                vocab=vocab,
                merges=[(left, right) for *_, left, right in ranked],
                unk_token=unk,
                fuse_unk=True,
                byte_fallback=True,
            )
        )
        # llama.cpp prepends the space to every text fragment (the start, and after each
        # special token), so a normalizer (run per fragment) and not a pre-tokenizer does it.
        steps: list[Any] = [normalizers.Replace(" ", _SPIECE_SPACE)]
        decode: list[Any] = [
            decoders.Replace(_SPIECE_SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
        ]
        if get("tokenizer.ggml.add_space_prefix", True):
            steps.insert(0, normalizers.Prepend(_SPIECE_SPACE))
            decode.append(decoders.Strip(" ", 1, 0))
        backend.normalizer = normalizers.Sequence(steps)
        backend.decoder = decoders.Sequence(decode)
        specials = [
            AddedToken(tok, special=t in (_CONTROL, _UNKNOWN), normalized=False)
            for tok, t in zip(tokens, types)
            if t in (_CONTROL, _USER_DEFINED, _UNKNOWN)
        ]
        backend.add_special_tokens([s for s in specials if s.special])
        backend.add_tokens([s for s in specials if not s.special])
        # SentencePiece models start every sequence with BOS unless the file says otherwise.
        return cls._with_gguf_specials(backend, get, add_bos_default=True)

    @classmethod
    def _with_gguf_specials(cls, backend: Any, get: Any, *, add_bos_default: bool) -> Tokenizer:
        eos = get("tokenizer.ggml.eos_token_id")
        eot = get("tokenizer.ggml.eot_token_id")
        eos_ids = [int(i) for i in (eos, eot) if i is not None]
        bos = get("tokenizer.ggml.bos_token_id")
        return cls(
            backend,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=list(dict.fromkeys(eos_ids)),
            add_bos_token=bool(get("tokenizer.ggml.add_bos_token", add_bos_default))
            and bos is not None,
        )

    def save(self, directory: str | os.PathLike[str], chat_template: str | None = None) -> None:
        """Write ``tokenizer.json`` and a ``tokenizer_config.json`` with the BOS/EOS settings."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.backend.save(os.fspath(out / "tokenizer.json"))
        meta: dict[str, Any] = {
            "bos_token": self.id_to_token(self.bos_token_id),
            "eos_token": self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else None,
            "eos_token_ids": list(self.eos_token_ids),
            "add_bos_token": self.add_bos_token,
        }
        if chat_template is not None:
            meta["chat_template"] = chat_template
        (out / "tokenizer_config.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")

    # ------------------------------------------------------------------ use
    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def id_to_token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(int(token_id))

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) map to
        their ids. ``add_bos`` defaults to the model's own setting."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            # `tokenizers` only says "TextInputSequence must be str" for these.
            bad = text[exc.start]
            raise ValueError(
                f"text is not valid Unicode: lone surrogate U+{ord(bad):04X} at index {exc.start}"
            ) from None
        ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos_token if add_bos is None else add_bos) and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        bad = [i for i in ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {bad[:3]}")
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def detokenizer(self, *, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text pieces whose concatenation equals
    ``tokenizer.decode(all_ids)``.

    Decoding single tokens is wrong for byte-level BPE (a UTF-8 character can span tokens) and
    for tokenizers whose spacing depends on neighbours, so each step decodes a short window
    ``ids[prefix:]`` and emits only the text beyond what ``ids[prefix:read]`` already produced,
    holding back while the window ends in an incomplete character (U+FFFD).
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        self.ids.append(int(token_id))
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        before = decode(self.ids[self._prefix : self._read], skip_special_tokens=skip)
        after = decode(self.ids[self._prefix :], skip_special_tokens=skip)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a trailing incomplete character) at end of stream."""
        skip = self.skip_special_tokens
        before = self.tokenizer.decode(
            self.ids[self._prefix : self._read], skip_special_tokens=skip
        )
        after = self.tokenizer.decode(self.ids[self._prefix :], skip_special_tokens=skip)
        self._prefix = self._read = len(self.ids)
        return after[len(before) :]
