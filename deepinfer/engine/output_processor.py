"""`OutputProcessor`: from emitted token ids to what a request's caller sees.

It builds each request's `RequestState` (detokenizer, stop strings, grammar matcher,
log-probabilities) and applies the stop rules, so the engine only decides what runs. Stop
rules, in vLLM's order, after each appended token: EOS (unless ``ignore_eos``) and
``stop_token_ids`` (neither before ``min_tokens``), then ``stop`` strings on the detokenised
text (across token boundaries; text after the match, or the match itself unless
``include_stop_str_in_output``, is cut), then ``max_tokens`` and the context length. Tokens
after the one that stopped a request (the rest of a speculative block) are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from deepinfer.engine.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from deepinfer.engine.request_state import RequestState
from deepinfer.engine.sampler import raw_logprobs
from deepinfer.engine.sequence import SeqStatus, Sequence
from deepinfer.engine.stop_strings import StopStringMatcher
from deepinfer.models.tokenizer import Tokenizer
from deepinfer_kernels import gather_logprobs
from deepinfer_kernels.sampling import GrammarCompiler

if TYPE_CHECKING:
    from deepinfer.engine.chunk import Chunk
    from deepinfer.engine.speculation import ForwardOutput


class OutputProcessor:
    """Appends emitted tokens to sequences, applies the stop rules, builds `RequestOutput`s."""

    def __init__(
        self, tokenizer: Tokenizer | None, max_model_len: int, vocab_size: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids: frozenset[int] = frozenset(
            tokenizer.eos_token_ids if tokenizer is not None else ()
        )
        self._eos_first = (
            tokenizer.eos_token_ids[0] if tokenizer and tokenizer.eos_token_ids else None
        )
        self._grammars: GrammarCompiler | None = None
        self._vocab_size = vocab_size

    # ------------------------------------------------------------------ lifecycle
    def track(self, seq: Sequence) -> None:
        """Build ``seq.state``. Raises ``ValueError`` naming the parameter when the request
        cannot be served (a constraint that does not compile, text rules without a tokenizer);
        ``seq`` is then left untouched."""
        p = seq.params
        tok = self.tokenizer
        if tok is None and (p.stop or p.structured_outputs is not None):
            which = "stop" if p.stop else "structured_outputs"
            raise ValueError(f"{which} needs a tokenizer; this engine was built without one")
        grammar = None
        if p.structured_outputs is not None:
            assert tok is not None
            if self._grammars is None:
                self._grammars = GrammarCompiler(
                    tok.backend.to_str(), tok.eos_token_ids, self._vocab_size
                )
            grammar = self._grammars.matcher(p.structured_outputs)
        banned: tuple[int, ...] = ()
        if p.min_tokens > 0:
            eos = () if p.ignore_eos else tuple(sorted(self.eos_token_ids))
            banned = tuple(dict.fromkeys(eos + tuple(p.stop_token_ids)))
        state = RequestState(
            params=p,
            detokenizer=tok.detokenizer(skip_special_tokens=p.skip_special_tokens) if tok else None,
            stop_strings=(
                StopStringMatcher(p.stop, include_in_output=p.include_stop_str_in_output)
                if p.stop
                else None
            ),
            grammar=grammar,
            early_banned=banned,
            eos_token_id=self._eos_first,
        )
        if p.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        seq.state = state

    # ------------------------------------------------------------------ tokens
    def append(self, seq: Sequence, tokens: Iterable[int]) -> tuple[list[int], str, str | None]:
        """Append ``tokens`` up to the first that stops the request.

        Returns the appended tokens, the text they release to the caller (everything, flushed,
        when the request stopped) and the finish reason (``None`` while it runs on).
        """
        if seq.state is None:
            self.track(seq)
        state = seq.state
        assert state is not None
        p = seq.params
        new: list[int] = []
        new_text = ""
        reason: str | None = None
        for j, token in enumerate(tokens):
            seq.output_ids.append(token)
            new.append(token)
            self._record_logprobs(state, j, token)
            if state.grammar is not None:
                state.grammar.advance(token)
            piece = state.detokenizer.push(token) if state.detokenizer is not None else ""
            reason, state.stop_reason = self.stop_reason(seq, token)
            if state.dead_end:
                reason, state.stop_reason = "stop", "no token allowed"
            if reason is not None and state.detokenizer is not None:
                piece += state.detokenizer.flush()
            if state.stop_strings is not None:
                check = len(seq.output_ids) >= p.min_tokens
                released, matched = state.stop_strings.push(piece, check=check)
                if matched is not None:
                    reason, state.stop_reason = "stop", matched
                elif reason is not None:
                    released += state.stop_strings.flush()
                piece = released
            new_text += piece
            if reason is not None:
                break
        state.pending_logprobs = None
        seq.text += new_text
        return new, new_text, reason

    def release_held_text(self, seq: Sequence) -> str:
        """Release the text held back (an incomplete character, a possible stop-string prefix)
        when a request ends for a reason none of its tokens decided; it joins ``seq.text``."""
        state = seq.state
        if state is None:
            return ""
        piece = state.detokenizer.flush() if state.detokenizer is not None else ""
        if state.stop_strings is not None:
            piece = state.stop_strings.push(piece, check=False)[0] + state.stop_strings.flush()
        seq.text += piece
        return piece

    def stop_reason(self, seq: Sequence, token: int) -> tuple[str | None, int | None]:
        """Token-level stop rules: ``("stop", token id)`` for a stop token, ``("stop", None)``
        for EOS, ``("length", None)`` at ``max_tokens`` or the context limit."""
        p = seq.params
        # ``token`` is already appended: it may stop the request once min_tokens came before it.
        if len(seq.output_ids) > p.min_tokens:
            if token in p.stop_token_ids:
                return "stop", token
            if not p.ignore_eos and token in self.eos_token_ids:
                return "stop", None
        if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", None
        return None, None

    def record_prompt_logprobs(
        self, chunks: Seq[Chunk], bases: Seq[int], out: ForwardOutput
    ) -> None:
        """After a forward: the prompt log-probabilities of requests that ask for them, from the
        rows of their prefill chunks (row of position ``q`` scores prompt token ``q + 1``).
        Positions already recorded (a chunk re-run after preemption) are skipped; the
        scheduler loads no cached prefix for these requests, so every position is computed."""
        for c, base, offset in zip(chunks, bases, out.offsets):
            state = c.seq.state
            if state is None or state.prompt_logprobs is None:
                continue
            prompt = c.seq.prompt_ids
            first = len(state.prompt_logprobs) - 1
            if c.start > first:
                continue  # not contiguous with what was recorded: never the case without a cache
            positions = [q for q in range(first, c.end) if q + 1 < len(prompt)]
            if not positions:
                continue
            rows = out.logits(torch.tensor([offset + q - base for q in positions]))
            state.prompt_logprobs += self._entries(
                raw_logprobs(rows),
                [prompt[q + 1] for q in positions],
                c.seq.params.prompt_logprobs or 0,
            )

    def _record_logprobs(self, state: RequestState, j: int, token: int) -> None:
        p = state.params
        if not p.needs_logprobs:
            return
        rows = state.pending_logprobs
        if rows is None or j >= rows.shape[0]:
            # The engine never saw this token's distribution (a PD request's first token).
            if state.logprobs is not None:
                state.logprobs.append({})
            return
        entry = self._entries(rows[j : j + 1], [token], p.logprobs or 0)[0]
        if state.cumulative_logprob is not None:
            state.cumulative_logprob += entry[token].logprob
        if state.logprobs is not None:
            state.logprobs.append(entry)

    def _entries(self, rows: torch.Tensor, tokens: list[int], top: int) -> list[PositionLogprobs]:
        """Per row of raw log-probabilities: the chosen token's entry first, then the ``top``
        most likely (ties by lower id; ranks as ``deepinfer_kernels.gather_logprobs`` counts
        them), each with its text, as vLLM reports them."""
        chosen, rank, top_ids, top_lp = gather_logprobs(rows, torch.tensor(tokens), top)
        out: list[PositionLogprobs] = []
        for r, token in enumerate(tokens):
            entry = {token: Logprob(float(chosen[r]), int(rank[r]), self._decode(token))}
            for j, (t, lp) in enumerate(zip(top_ids[r].tolist(), top_lp[r].tolist()), start=1):
                if t not in entry:
                    entry[t] = Logprob(lp, j, self._decode(t))
            out.append(entry)
        return out

    def _decode(self, token: int) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([token], skip_special_tokens=False)

    # ------------------------------------------------------------------ outputs
    @staticmethod
    def output(seq: Sequence, new: list[int], new_text: str) -> RequestOutput:
        state = seq.state
        finished = seq.status is SeqStatus.FINISHED
        completion = CompletionOutput(
            index=0,
            text=seq.text,
            token_ids=list(seq.output_ids),
            cumulative_logprob=state.cumulative_logprob if state else None,
            logprobs=list(state.logprobs) if state and state.logprobs is not None else None,
            finish_reason=seq.finish_reason if finished else None,
            stop_reason=state.stop_reason if state and finished else None,
        )
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_ids,
            token_ids=completion.token_ids,
            text=seq.text,
            new_token_ids=new,
            new_text=new_text,
            finished=finished,
            finish_reason=seq.finish_reason,
            metrics=seq.metrics,
            outputs=[completion],
            prompt_logprobs=state.prompt_logprobs if state else None,
        )
