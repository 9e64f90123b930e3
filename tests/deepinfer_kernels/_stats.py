"""Chi-square helpers for the statistical (losslessness / exact sampling) tests."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats


def assert_matches(tokens: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Chi-square goodness of fit of integer ``tokens`` to ``probs`` (flat categories).

    Categories of probability zero must never occur. Categories whose expected count is below
    ``min_expected`` are pooled into one bin so the chi-square approximation holds.
    Returns the p-value after asserting it exceeds 1e-3.
    """
    probs = probs.double().flatten()
    probs = probs / probs.sum()
    n = tokens.numel()
    observed = np.bincount(tokens.flatten().numpy(), minlength=probs.numel()).astype(np.float64)
    assert observed.shape[0] == probs.numel(), "a token outside the category range was emitted"
    expected = probs.numpy() * n
    zero = expected == 0
    assert observed[zero].sum() == 0, (
        f"zero-probability categories drawn: {np.flatnonzero(observed * zero)}"
    )
    small = (expected < min_expected) & ~zero
    obs = np.concatenate([observed[~zero & ~small], [observed[small].sum()]])
    exp = np.concatenate([expected[~zero & ~small], [expected[small].sum()]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    p_value = float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
    assert p_value > 1e-3, f"chi-square p-value {p_value:.2e}"
    return p_value


def device_generator(
    generator: torch.Generator | None, device: torch.device | str
) -> torch.Generator | None:
    """A generator on ``device`` seeded from ``generator`` (a CPU one), so that kernel runs on any
    device draw from a seeded stream rather than the process-global RNG, whose state depends on
    which tests ran earlier in the same worker."""
    if generator is None:
        return None
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)
