"""sample (torch path) draws exactly from the filtered distribution: chi-square frequencies."""

from __future__ import annotations

import pytest
import torch
from _sampling_stats import check_sample_frequencies
from _stats import assert_matches

import deepinfer_kernels as dk


def test_sample_frequencies_match_filtered_distribution():
    check_sample_frequencies(dk.sample, rows_per_setting=50_000, vocab=37, seed=3)


def test_per_row_parameters_are_independent():
    # Alternate two settings row by row: a stride bug would mix their supports.
    gen = torch.Generator().manual_seed(4)
    vocab, batch = 20, 40_000
    logits = torch.randn(vocab, generator=gen).expand(batch, vocab)
    even = torch.arange(batch) % 2 == 0
    t = torch.where(even, 1.0, 0.5)
    k = torch.where(even, 3, 0)
    p = torch.where(even, 1.0, 0.7)
    tokens = dk.sample(logits, t, k, p, None, generator=gen)
    want = dk.sampling_probs(logits[:2], t[:2], k[:2], p[:2])
    assert_matches(tokens[even], want[0])
    assert_matches(tokens[~even], want[1])


def test_detector_catches_a_wrong_temperature():
    def wrong(logits, t, k, p, m, generator=None):
        return dk.sample(logits, t * 1.1, k, p, m, generator=generator)

    with pytest.raises(AssertionError, match="p-value"):
        check_sample_frequencies(wrong, rows_per_setting=50_000, vocab=37, seed=3)
