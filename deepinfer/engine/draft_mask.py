"""`DraftMask`: a request's hard constraints applied to the drafter's logits while it drafts.

The verifier already processes the target's logits (``sampler.prepare_verify_logits``), which
keeps speculative decoding lossless whatever the drafter proposes. Masking the drafter too
(structured-output grammar, ``allowed_token_ids``, the ``min_tokens`` ban) stops it from
proposing tokens that can only be rejected, so more drafts survive. The mask is applied before
each draft token is drawn (``deepinfer_spec.propose``'s ``logits_hook``), so the draft
probabilities handed to verification are those of the masked distribution, as rejection
sampling requires. Soft rewrites (penalties, bias, custom processors) are left to the verifier.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from deepinfer.engine.sequence import Sequence
from deepinfer_kernels.sampling import unpack_bitmask


def _constrained(seq: Sequence) -> bool:
    p, state = seq.params, seq.state
    grammar = state is not None and state.grammar is not None
    early = state is not None and bool(state.early_banned) and len(seq.output_ids) < p.min_tokens
    return grammar or p.allowed_token_ids is not None or early


class DraftMask:
    """The ``logits_hook`` of one ``draft_block`` call over ``seqs`` (its rows, in order).

    Grammar matchers advance tentatively through the drafts as they are drawn; :meth:`close`
    rolls them back. A row whose constraints leave none of the drafter's columns allowed is
    left unmasked (its drafts will be rejected by the verifier, losslessly).
    """

    def __init__(self, seqs: Seq[Sequence], vocab_size: int, draft_vocab_ids: torch.Tensor | None):
        self.seqs = list(seqs)
        self.vocab_size = vocab_size
        self.columns = draft_vocab_ids
        self.rows = {i for i, s in enumerate(self.seqs) if _constrained(s)}
        self._consumed = [0] * len(self.seqs)  # drafts consumed by each row's grammar
        self._broken = [False] * len(self.seqs)  # a draft the grammar refused (row unmasked)

    @property
    def active(self) -> bool:
        return bool(self.rows)

    def __call__(
        self, rows: torch.Tensor, k: int, prefix: torch.Tensor, logits: torch.Tensor
    ) -> torch.Tensor:
        for j, r in enumerate(rows.tolist()):
            if r not in self.rows:
                continue
            allowed = self._allowed(r, k, prefix[j].tolist())
            if allowed is None:
                continue
            if self.columns is not None:
                allowed = allowed[self.columns.to(allowed.device)]
            if bool(allowed.any()):
                logits[j] = logits[j].masked_fill(~allowed.to(logits.device), float("-inf"))
        return logits

    def _allowed(self, r: int, k: int, prefix: list[int]) -> torch.Tensor | None:
        seq = self.seqs[r]
        state, p = seq.state, seq.params
        allowed = torch.ones(self.vocab_size, dtype=torch.bool)
        grammar = state.grammar if state is not None else None
        if grammar is not None:
            # Catch the grammar up with the drafts drawn so far (one per call, in order).
            while not self._broken[r] and self._consumed[r] < k:
                if grammar.try_advance(prefix[self._consumed[r]]):
                    self._consumed[r] += 1
                else:
                    self._broken[r] = True
            if self._broken[r]:
                return None
            bits = grammar.bitmask()[None]
            allowed &= unpack_bitmask(bits, self.vocab_size)[0]
        if p.allowed_token_ids is not None:
            keep = torch.zeros(self.vocab_size, dtype=torch.bool)
            keep[[t for t in p.allowed_token_ids if t < self.vocab_size]] = True
            allowed &= keep
        if state is not None and state.early_banned and len(seq.output_ids) + k < p.min_tokens:
            allowed[[t for t in state.early_banned if t < self.vocab_size]] = False
        return allowed

    def close(self) -> None:
        """Return every grammar to where it was before drafting."""
        for r, seq in enumerate(self.seqs):
            grammar = seq.state.grammar if seq.state is not None else None
            if grammar is not None:
                grammar.rollback(self._consumed[r])
            self._consumed[r] = 0
