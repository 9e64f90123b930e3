"""`DraftMask`: requests' hard constraints applied to the drafter's logits while it drafts.

A serving stack already processes the target's logits before verification, which keeps
speculative decoding lossless whatever the drafter proposes. Masking the drafter too (a
structured-output grammar, an allowed-token list, a ban on EOS/stop tokens until ``min_tokens``)
stops it from proposing tokens that can only be rejected, so more drafts survive. The mask is
applied before each draft token is drawn (:meth:`BatchSpeculator.draft`'s ``logits_hook``), so
the draft probabilities handed to verification are those of the masked distribution, as
rejection sampling requires. Soft rewrites (penalties, bias, custom processors) are left to the
verifier. Example::

    rows = [None, DraftConstraints(allowed_token_ids=(3, 5))]  # row 0 unconstrained
    mask = DraftMask(rows, drafter.vocab_size, drafter.draft_vocab_ids)
    try:
        spec.draft(plan, mask if mask.active else None)
    finally:
        mask.close()  # grammars back where they were before drafting
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from deepinfer_kernels.sampling import unpack_bitmask

__all__ = ["DraftConstraints", "DraftGrammar", "DraftMask"]


class DraftGrammar(Protocol):
    """A grammar matcher that can advance tentatively (``deepinfer_kernels.sampling``'s
    ``GrammarMatcher``, xgrammar's ``GrammarMatcher``)."""

    def bitmask(self) -> torch.Tensor:
        """int32 ``[ceil(V / 32)]`` mask of the tokens allowed next."""
        ...

    def try_advance(self, token: int) -> bool:
        """Consume ``token`` if allowed (False leaves the matcher unchanged)."""
        ...

    def rollback(self, num_tokens: int) -> None: ...


@dataclass(frozen=True)
class DraftConstraints:
    """One request's hard constraints at its next position.

    ``grammar``: its matcher, where the request's output is now (advanced tentatively through
    the drafts, then rolled back); ``allowed_token_ids``: the only ids it may emit;
    ``banned_token_ids`` are forbidden for the first ``banned_for`` drafts (EOS and stop tokens
    while fewer than ``min_tokens`` are out)."""

    grammar: DraftGrammar | None = None
    allowed_token_ids: Sequence[int] | None = None
    banned_token_ids: Sequence[int] = ()
    banned_for: int = 0

    @property
    def active(self) -> bool:
        banned = bool(self.banned_token_ids) and self.banned_for > 0
        return self.grammar is not None or self.allowed_token_ids is not None or banned


class DraftMask:
    """The ``logits_hook`` of one draft call over rows with these constraints (``None``: the
    row is unconstrained), in the order of the call's rows.

    Grammar matchers advance tentatively through the drafts as they are drawn; :meth:`close`
    rolls them back. A row whose constraints leave none of the drafter's columns allowed is
    left unmasked (its drafts will be rejected by the verifier, losslessly).
    """

    def __init__(
        self,
        constraints: Sequence[DraftConstraints | None],
        vocab_size: int,
        draft_vocab_ids: torch.Tensor | None,
    ) -> None:
        self.constraints = list(constraints)
        self.vocab_size = vocab_size
        self.columns = draft_vocab_ids
        self.rows = {i for i, c in enumerate(self.constraints) if c is not None and c.active}
        self._consumed = [0] * len(self.constraints)  # drafts consumed by each row's grammar
        self._broken = [False] * len(self.constraints)  # a draft the grammar refused

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
        c = self.constraints[r]
        assert c is not None
        allowed = torch.ones(self.vocab_size, dtype=torch.bool)
        if c.grammar is not None:
            # Catch the grammar up with the drafts drawn so far (one per call, in order).
            while not self._broken[r] and self._consumed[r] < k:
                if c.grammar.try_advance(prefix[self._consumed[r]]):
                    self._consumed[r] += 1
                else:
                    self._broken[r] = True
            if self._broken[r]:
                return None
            allowed &= unpack_bitmask(c.grammar.bitmask()[None], self.vocab_size)[0]
        if c.allowed_token_ids is not None:
            keep = torch.zeros(self.vocab_size, dtype=torch.bool)
            keep[[t for t in c.allowed_token_ids if t < self.vocab_size]] = True
            allowed &= keep
        if c.banned_token_ids and k < c.banned_for:
            allowed[[t for t in c.banned_token_ids if t < self.vocab_size]] = False
        return allowed

    def close(self) -> None:
        """Return every grammar to where it was before drafting."""
        for r, c in enumerate(self.constraints):
            if c is not None and c.grammar is not None:
                c.grammar.rollback(self._consumed[r])
            self._consumed[r] = 0
