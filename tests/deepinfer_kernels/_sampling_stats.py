"""Frequency checks of ``sample`` against the filtered distribution, shared by both paths."""

from __future__ import annotations

from collections.abc import Callable

import torch
from _stats import assert_matches

from deepinfer_kernels.reference import sampling_probs_reference

SETTINGS = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 1.0, 0.0),
    (0.7, 5, 1.0, 0.0),
    (1.3, 0, 0.8, 0.0),
    (1.0, 12, 0.9, 0.05),
]


def check_sample_frequencies(
    sample: Callable[..., torch.Tensor], rows_per_setting: int, vocab: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(vocab, generator=gen)
    for temperature, top_k, top_p, min_p in SETTINGS:
        batch = rows_per_setting
        t = torch.full((batch,), temperature)
        k = torch.full((batch,), top_k)
        p = torch.full((batch,), top_p)
        m = torch.full((batch,), min_p)
        tokens = sample(logits.expand(batch, vocab), t, k, p, m, generator=gen)
        want = sampling_probs_reference(logits[None], t[:1], k[:1], p[:1], m[:1])[0]
        assert_matches(tokens, want)
