"""Structured output through llguidance: constraints compiled into per-request token matchers.

llguidance (Microsoft's low-level guidance library, also behind vLLM's and llama.cpp's
``guidance`` backends) was chosen because it installs as one self-contained wheel and runs on
a HuggingFace ``tokenizers`` JSON; xgrammar imports ``transformers`` (and declares ``triton``)
at import time. It is an optional dependency (``pip install 'deepinfer-kernels[grammar]'``),
imported on first use. A ``GrammarCompiler`` turns a `StructuredOutputsParams` into a
``GrammarMatcher`` per request: the matcher yields the packed int32 token bitmask of the next
position (the layout ``token_bitmask`` builds and ``apply_token_bitmask`` applies) and advances
as tokens are emitted. For speculative verification it can advance tentatively through draft
tokens and roll back (``masks_along``).

Example::

    compiler = GrammarCompiler(hf_tokenizer.to_str(), eos_token_ids=[2], vocab_size=49152)
    matcher = compiler.matcher(StructuredOutputsParams(regex=r"(yes|no)"))
    logits = apply_token_bitmask(logits, matcher.bitmask()[None])
    matcher.advance(token)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from deepinfer_kernels.sampling.structured import StructuredOutputsParams

# JSON is generated in json.dumps' layout (", " and ": ", no other whitespace): with free
# whitespace a model can spend its whole budget on blanks inside a valid document. A schema can
# still override this through its "x-guidance" key.
_JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _lark_literal(text: str) -> str:
    # Lark string literals take JSON-style escapes, so json.dumps quotes any text safely.
    return json.dumps(text)


class GrammarCompiler:
    """Compiles constraints for one tokenizer (building llguidance's tokenizer view, about a
    second for a 49k vocabulary, happens once, on first use).

    ``tokenizer_json``: the HuggingFace ``tokenizers`` serialisation (``Tokenizer.to_str()``);
    ``eos_token_ids``: the tokens a finished grammar allows; ``vocab_size``: the model's rows
    of logits when they exceed the tokenizer's (``None``: the tokenizer's).
    """

    def __init__(
        self,
        tokenizer_json: str,
        eos_token_ids: Sequence[int] = (),
        vocab_size: int | None = None,
    ) -> None:
        if not isinstance(tokenizer_json, str) or not tokenizer_json:
            raise TypeError("tokenizer_json: expected the tokenizer's JSON text (to_str())")
        if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size < 1):
            raise ValueError(f"vocab_size: expected None or an int >= 1, got {vocab_size!r}")
        self.tokenizer_json = tokenizer_json
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.vocab_size = vocab_size
        self._ll_tokenizer: Any = None

    def _llg(self) -> Any:
        try:
            import llguidance
        except ImportError:  # pragma: no cover - the optional "grammar" extra
            raise ValueError(
                "structured_outputs needs the llguidance package "
                "(pip install 'deepinfer-kernels[grammar]')"
            ) from None
        return llguidance

    def ll_tokenizer(self) -> Any:
        if self._ll_tokenizer is None:
            llg = self._llg()
            self._ll_tokenizer = llg.LLTokenizer(
                self.tokenizer_json,
                n_vocab=self.vocab_size,
                eos_token=self.eos_token_ids or None,
            )
        return self._ll_tokenizer

    def grammar(self, params: StructuredOutputsParams) -> str:
        """llguidance's grammar text for ``params``."""
        matcher = self._llg().LLMatcher
        kind = params.kind
        if kind == "json":
            return str(matcher.grammar_from_json_schema(params.json, defaults=_JSON_DEFAULTS))
        if kind == "json_object":
            return str(
                matcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_DEFAULTS)
            )
        if kind == "regex":
            return str(matcher.grammar_from_regex(params.regex))
        if kind == "choice":
            assert params.choice is not None
            alternatives = " | ".join(_lark_literal(c) for c in params.choice)
            return str(matcher.grammar_from_lark(f"start: {alternatives}"))
        assert params.grammar is not None
        text = params.grammar
        if "::=" in text:  # GBNF (llama.cpp / xgrammar EBNF): llguidance converts it to Lark
            from llguidance.gbnf_to_lark import gbnf_to_lark

            text = gbnf_to_lark(text)
        return str(matcher.grammar_from_lark(text))

    def matcher(self, params: StructuredOutputsParams) -> GrammarMatcher:
        """A fresh matcher at the start of the output; ``ValueError`` names a bad constraint."""
        llg = self._llg()
        try:
            grammar = self.grammar(params)
        except ValueError as exc:
            raise ValueError(f"structured_outputs.{params.kind}: {exc}") from None
        inner = llg.LLMatcher(self.ll_tokenizer(), grammar, log_level=0)
        if inner.is_error():
            # llguidance's message spans lines (a caret under the offending text): one line here.
            detail = " ".join(line.strip() for line in inner.get_error().splitlines())
            raise ValueError(f"structured_outputs.{params.kind} does not compile: {detail[:300]}")
        return GrammarMatcher(inner, self.ll_tokenizer().vocab_size)


class GrammarMatcher:
    """Where one request is in its grammar."""

    def __init__(self, inner: Any, vocab_size: int) -> None:
        self.inner = inner
        self.words = -(-vocab_size // 32)

    def bitmask(self) -> torch.Tensor:
        """int32 ``[W]`` mask of the tokens allowed next (only EOS once the grammar is done)."""
        return torch.frombuffer(bytearray(self.inner.compute_bitmask()), dtype=torch.int32)

    def advance(self, token: int) -> bool:
        """Consume an emitted token; False if the grammar does not allow it (the matcher is then
        in an error state and allows nothing more)."""
        return bool(self.inner.consume_token(int(token)))

    def try_advance(self, token: int) -> bool:
        """Consume ``token`` if the grammar allows it (False leaves the matcher unchanged);
        undo with :meth:`rollback`."""
        return int(self.inner.try_consume_tokens([int(token)])) == 1

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.inner.rollback(num_tokens)

    def masks_along(self, drafts: Sequence[int], positions: int) -> torch.Tensor:
        """Masks ``[positions, W]`` for a verify block: position ``j`` is the mask after the
        first ``j`` drafts. The matcher ends where it started. Positions after a draft the
        grammar rejects repeat that rejecting position's mask: verification rejects that draft
        there, so later positions are never sampled from."""
        out = torch.empty(positions, self.words, dtype=torch.int32)
        consumed = 0
        for j in range(positions):
            out[j] = self.bitmask()
            more = j < len(drafts) and j + 1 < positions and consumed == j
            if more and self.inner.try_consume_tokens([int(drafts[j])]) == 1:
                consumed += 1
            if consumed <= j and j + 1 < positions:
                out[j + 1 :] = out[j]
                break
        if consumed:
            self.inner.rollback(consumed)
        return out
