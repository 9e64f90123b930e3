"""`OutputProcessor`: from emitted token ids to what a request's caller sees.

It owns the per-request incremental detokenizers and the stop rules (stop tokens, EOS unless
``ignore_eos``, ``max_tokens``, the context length), so the engine only decides what runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sequence import SeqStatus, Sequence
from deepinfer.models.tokenizer import IncrementalDetokenizer, Tokenizer


class OutputProcessor:
    """Appends emitted tokens to sequences, applies the stop rules, builds `RequestOutput`s."""

    def __init__(self, tokenizer: Tokenizer | None, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids: frozenset[int] = frozenset(
            tokenizer.eos_token_ids if tokenizer is not None else ()
        )
        self._detok: dict[int, IncrementalDetokenizer] = {}

    def track(self, seq: Sequence) -> None:
        """Start detokenizing ``seq`` (no-op without a tokenizer)."""
        if self.tokenizer is not None:
            self._detok[seq.seq_id] = self.tokenizer.detokenizer()

    def forget(self, seq: Sequence) -> None:
        self._detok.pop(seq.seq_id, None)

    def append(self, seq: Sequence, tokens: Iterable[int]) -> tuple[list[int], str, str | None]:
        """Append ``tokens`` up to the first that stops the request.

        Returns the appended tokens, their text (flushed when the request stopped) and the
        finish reason (``None`` while it runs on).
        """
        new: list[int] = []
        reason: str | None = None
        for token in tokens:
            seq.output_ids.append(token)
            new.append(token)
            reason = self.stop_reason(seq, token)
            if reason is not None:
                break
        new_text = ""
        detok = self._detok.get(seq.seq_id)
        if detok is not None:
            new_text = "".join(detok.push(t) for t in new)
            if reason is not None:
                new_text += detok.flush()
            seq.text += new_text
        return new, new_text, reason

    def stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if token in p.stop_token_ids:
            return "stop"
        if not p.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    @staticmethod
    def output(seq: Sequence, new: list[int], new_text: str) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_ids,
            token_ids=list(seq.output_ids),
            text=seq.text,
            new_token_ids=new,
            new_text=new_text,
            finished=seq.status is SeqStatus.FINISHED,
            finish_reason=seq.finish_reason,
            metrics=seq.metrics,
        )
