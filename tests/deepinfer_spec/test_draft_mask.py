"""`deepinfer_spec.DraftMask` against a brute-force reading of each row's constraints: a toy
grammar (the allowed next ids depend on how many tokens it consumed), allowed ids and a ban
that lifts after ``banned_for`` drafts; grammars are rolled back by ``close``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.sampling import token_bitmask
from deepinfer_spec import DraftConstraints, DraftMask

V = 40


class StepGrammar:
    """Allows ``t`` next when ``(t + consumed) % 3 == 0``; only counts what it consumed."""

    def __init__(self) -> None:
        self.consumed: list[int] = []

    def allowed(self) -> set[int]:
        return {t for t in range(V) if (t + len(self.consumed)) % 3 == 0}

    def bitmask(self) -> torch.Tensor:
        return token_bitmask(sorted(self.allowed()), V)

    def try_advance(self, token: int) -> bool:
        if token not in self.allowed():
            return False
        self.consumed.append(token)
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.consumed[len(self.consumed) - num_tokens :]


def _expected(c: DraftConstraints | None, prefix: list[int]) -> set[int] | None:
    """The ids a row may draw at draft ``len(prefix)``; None: the row is left as it is."""
    if c is None or not c.active:
        return None
    allowed = set(range(V))
    if c.grammar is not None:
        fresh = StepGrammar()
        if not all(fresh.try_advance(t) for t in prefix):
            return None  # a draft the grammar refused: verification rejects, no mask
        allowed &= fresh.allowed()
    if c.allowed_token_ids is not None:
        allowed &= set(c.allowed_token_ids)
    if len(prefix) < c.banned_for:
        allowed -= set(c.banned_token_ids)
    return allowed or None  # nothing left: unmasked


_ids = st.lists(st.integers(0, V - 1), min_size=1, max_size=8, unique=True)
_row = st.one_of(
    st.none(),
    st.builds(
        DraftConstraints,
        st.booleans().map(lambda g: StepGrammar() if g else None),
        st.none() | _ids,
        st.lists(st.integers(0, V - 1), max_size=3).map(tuple),
        st.integers(-2, 4),
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_row, min_size=1, max_size=4), st.data())
def test_mask_matches_each_rows_constraints_at_every_draft(
    rows: list[DraftConstraints | None], data: st.DataObject
) -> None:
    gamma = 4
    drafts = [
        data.draw(st.lists(st.integers(0, V - 1), min_size=gamma, max_size=gamma)) for _ in rows
    ]
    mask = DraftMask(rows, V, None)
    assert mask.rows == {i for i, c in enumerate(rows) if c is not None and c.active}
    assert mask.active == bool(mask.rows)
    order = torch.arange(len(rows))
    for k in range(gamma):
        prefix = torch.tensor([d[:k] for d in drafts], dtype=torch.int64).reshape(len(rows), k)
        out = mask(order, k, prefix, torch.zeros(len(rows), V))
        for i, c in enumerate(rows):
            want = _expected(c, drafts[i][:k])
            got = set(torch.isfinite(out[i]).nonzero().flatten().tolist())
            assert got == (set(range(V)) if want is None else want), (i, k)
    mask.close()
    for c in rows:
        if c is not None and c.grammar is not None:
            assert c.grammar.consumed == []  # type: ignore[attr-defined]


def test_draft_vocabulary_columns_and_row_subsets() -> None:
    """With a draft vocabulary the logits are over its columns; rows are the call's rows."""
    columns = torch.tensor([1, 3, 5, 7])
    rows = [DraftConstraints(allowed_token_ids=(3, 7)), None]
    mask = DraftMask(rows, V, columns)
    out = mask(torch.tensor([1, 0]), 0, torch.zeros(2, 0, dtype=torch.int64), torch.zeros(2, 4))
    assert torch.isfinite(out[0]).all()  # row 1 of the call: unconstrained
    assert torch.isfinite(out[1]).tolist() == [False, True, False, True]


@pytest.mark.parametrize(
    ("constraints", "active"),
    [
        (DraftConstraints(), False),
        (DraftConstraints(banned_token_ids=(2,), banned_for=0), False),  # min_tokens reached
        (DraftConstraints(banned_token_ids=(2,), banned_for=1), True),
        (DraftConstraints(allowed_token_ids=(1,)), True),
        (DraftConstraints(grammar=StepGrammar()), True),
    ],
)
def test_active_only_with_a_constraint_in_force(
    constraints: DraftConstraints, active: bool
) -> None:
    assert constraints.active is active
