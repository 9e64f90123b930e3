"""Statistical losslessness of speculative_verify (torch path), 200k trials per check."""

from __future__ import annotations

import pytest
from _verify_stats import check_first_token, check_first_two_tokens

import deepinfer_kernels as dk

TRIALS = 200_000


@pytest.mark.parametrize("zero_frac", [0.0, 0.4])
@pytest.mark.parametrize("one_hot", [False, True])
def test_first_emitted_token_follows_target(zero_frac, one_hot):
    check_first_token(
        dk.speculative_verify,
        TRIALS,
        vocab=48,
        gamma=4,
        seed=11,
        zero_frac=zero_frac,
        one_hot=one_hot,
    )


@pytest.mark.parametrize("zero_frac", [0.0, 0.3])
def test_first_two_tokens_follow_target_two_step_distribution(zero_frac):
    check_first_two_tokens(dk.speculative_verify, TRIALS, vocab=8, seed=5, zero_frac=zero_frac)


def test_detector_catches_a_lossy_rule():
    # Sanity check of the test itself: verifying against a mis-reported draft distribution
    # (uniform instead of the one the drafts came from) is not lossless and must be caught.
    def misreported(ids, draft, target, n, generator=None):
        uniform = draft * 0 + 1.0 / draft.shape[-1]
        return dk.speculative_verify(ids, uniform, target, n, generator=generator)

    with pytest.raises(AssertionError, match="p-value"):
        check_first_token(
            misreported, 50_000, vocab=16, gamma=3, seed=1, zero_frac=0.0, one_hot=False
        )
