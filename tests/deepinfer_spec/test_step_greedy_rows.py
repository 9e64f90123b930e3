"""verify_block's greedy-only path (no value checks) equals greedy_verify's rule exactly."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels import greedy_verify
from deepinfer_spec import DraftBlock, verify_block


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    batch=st.integers(1, 5),
    gamma=st.integers(1, 5),
    vocab=st.sampled_from([2, 3, 17]),
    ties=st.booleans(),
)
def test_greedy_rows_match_greedy_verify(
    seed: int, batch: int, gamma: int, vocab: int, ties: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = torch.randint(0, gamma + 1, (batch,), generator=gen)
    width = max(int(n.max()), 1) + 1
    logits = torch.randn(batch, width, vocab, generator=gen)
    if ties:  # small vocabularies with equal maxima: the lowest id wins
        logits = logits.round()
    best = logits.argmax(-1)
    # Drafts that mostly agree with the target, so rows accept 0 .. n of them.
    drafts = torch.where(
        torch.rand(batch, gamma, generator=gen) < 0.7,
        torch.nn.functional.pad(best, (0, gamma + 1 - width))[:, :gamma],
        torch.randint(0, vocab, (batch, gamma), generator=gen),
    )
    block = DraftBlock(drafts, torch.zeros(batch, gamma), n, None)
    got = verify_block(block, logits, [0.0] * batch, check_values=False)
    want = greedy_verify(drafts[:, : width - 1], logits, n)
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.num_emitted, want.num_emitted)
    assert torch.equal(got.output_ids, want.output_ids)
