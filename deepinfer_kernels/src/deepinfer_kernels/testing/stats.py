"""Statistical checkers for samplers and speculative verifiers (no scipy needed).

* :func:`chi_square_p_value` / :func:`assert_distribution`: do integer draws follow ``probs``?
  A draw of a zero-probability category fails outright (a support error is not a statistics
  question).
* :func:`check_lossless`: is ``verify_fn`` (the ``speculative_verify`` signature) lossless, i.e.
  is its first emitted token distributed as the target's first row, for ragged draft counts
  and a real (non-one-hot) draft? It first runs a *negative control*: the same ``verify_fn``
  run against a target whose first row was shifted by ``control_shift`` in total variation
  must be caught at the same number of trials, else the test had no power and says so
  instead of passing.
* :func:`check_sampler`: does ``sample_fn`` (the ``sample`` signature) draw exactly from
  ``sampling_probs_reference`` under top-k / top-p / min-p: never outside the kept support,
  and with the kept distribution?

Every failure message carries the seed that reproduces it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from deepinfer_kernels.reference.sampling import sampling_probs_reference


def chi_square_p_value(
    tokens: torch.Tensor, probs: torch.Tensor, *, min_expected: float = 5.0
) -> float:
    """Pearson chi-square goodness of fit of integer ``tokens`` to ``probs`` (flattened).

    Categories with an expected count under ``min_expected`` are pooled into one bin so the
    chi-square approximation holds. Raises ``AssertionError`` when a token is out of range or
    has probability zero."""
    p = probs.detach().double().flatten().cpu()
    p = p / p.sum()
    t = tokens.detach().flatten().cpu().long()
    if t.numel() == 0:
        raise ValueError("tokens: expected at least one draw")
    bad = (t < 0) | (t >= p.numel())
    if bool(bad.any()):
        raise AssertionError(f"tokens outside [0, {p.numel()}) drawn: {t[bad][:8].tolist()}")
    observed = torch.bincount(t, minlength=p.numel()).double()
    expected = p * t.numel()
    zero = expected == 0
    if bool((observed[zero] > 0).any()):
        drawn = torch.nonzero(zero & (observed > 0)).flatten()[:8].tolist()
        raise AssertionError(f"zero-probability categories drawn: {drawn}")
    small = (expected < min_expected) & ~zero
    obs = torch.cat([observed[~zero & ~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~zero & ~small], expected[small].sum().reshape(1)])
    if float(exp[-1]) == 0.0:
        obs, exp = obs[:-1], exp[:-1]
    if exp.numel() < 2:
        return 1.0  # one category: nothing to test beyond the support
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = exp.numel() - 1
    # Chi-square survival function = regularised upper incomplete gamma Q(dof/2, x/2).
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def assert_distribution(
    tokens: torch.Tensor, probs: torch.Tensor, *, alpha: float = 1e-3, what: str = "draws"
) -> float:
    """Assert ``tokens`` follow ``probs`` at level ``alpha``; returns the p-value."""
    p_value = chi_square_p_value(tokens, probs)
    if p_value <= alpha:
        raise AssertionError(f"{what}: chi-square p-value {p_value:.2e} <= {alpha:g}")
    return p_value


def _random_rows(shape: tuple[int, ...], gen: torch.Generator, zero_frac: float) -> torch.Tensor:
    w = torch.rand(shape, generator=gen) ** 2
    w = torch.where(torch.rand(shape, generator=gen) < zero_frac, 0.0, w)
    keep = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    w.scatter_(-1, keep.unsqueeze(-1), 1.0)  # every row keeps mass
    return w / w.sum(-1, keepdim=True)


def _first_token_p_value(
    verify_fn: Callable[..., Any], *, trials: int, vocab: int, gamma: int, seed: int,
    zero_frac: float, shift: float,
) -> float:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    p_t = _random_rows((1, gamma + 1, vocab), gen, zero_frac)
    p_d = _random_rows((1, gamma, vocab), gen, zero_frac)
    ids = torch.multinomial(p_d[0], trials, replacement=True, generator=gen).T
    n = torch.randint(0, gamma + 1, (trials,), generator=gen)
    ids = torch.where(torch.arange(gamma)[None] < n[:, None], ids, -1)
    # The negative control runs against a target whose first row moved by `shift` in total
    # variation (mass moved onto its most likely token) and is judged against the unmoved row.
    run_t = p_t.clone()
    if shift > 0:
        row = run_t[0, 0]
        top = int(row.argmax())
        moved = row * (1.0 - shift)
        moved[top] += shift
        run_t[0, 0] = moved
    res = verify_fn(
        ids, p_d.expand(trials, gamma, vocab).contiguous(),
        run_t.expand(trials, gamma + 1, vocab).contiguous(), n, generator=gen,
    )  # fmt: skip
    first = res.output_ids[:, 0] if hasattr(res, "output_ids") else res[0][:, 0]
    return chi_square_p_value(first, p_t[0, 0])


def check_lossless(
    verify_fn: Callable[..., Any],
    *,
    trials: int = 20_000,
    vocab: int = 16,
    gamma: int = 3,
    seed: int = 0,
    zero_frac: float = 0.25,
    alpha: float = 1e-3,
    control_shift: float = 0.05,
) -> float:
    """Statistical test that ``verify_fn(ids, draft_probs, target_probs, n, generator=)``
    emits its first token exactly from the target (Leviathan et al.'s guarantee).

    Runs the negative control first (a target moved by ``control_shift`` in total variation
    must give ``p <= alpha``) so a passing result means the test could see an error that
    size; returns the p-value of the real test."""
    control = _first_token_p_value(
        verify_fn, trials=trials, vocab=vocab, gamma=gamma, seed=seed + 1,
        zero_frac=zero_frac, shift=control_shift,
    )  # fmt: skip
    if control > alpha:
        raise AssertionError(
            f"check_lossless: the negative control (target moved by {control_shift} in total "
            f"variation) was not caught (p = {control:.2e}) with trials={trials}, "
            f"vocab={vocab}, seed={seed}; raise trials"
        )
    p_value = _first_token_p_value(
        verify_fn, trials=trials, vocab=vocab, gamma=gamma, seed=seed,
        zero_frac=zero_frac, shift=0.0,
    )  # fmt: skip
    if p_value <= alpha:
        raise AssertionError(
            f"check_lossless: first emitted token is not distributed as the target "
            f"(chi-square p = {p_value:.2e}; trials={trials}, vocab={vocab}, gamma={gamma}, "
            f"seed={seed})"
        )
    return p_value


def check_sampler(
    sample_fn: Callable[..., Any],
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    temperature: float = 1.0,
    vocab: int = 24,
    trials: int = 20_000,
    seed: int = 0,
    alpha: float = 1e-3,
) -> float:
    """Statistical test that ``sample_fn(logits, temperature, top_k, top_p, min_p,
    generator=)`` (one token per row) draws exactly from :func:`sampling_probs_reference`:
    never a token outside the kept support, and the kept distribution by chi-square."""
    gen = torch.Generator().manual_seed(seed)
    row = torch.randn(1, vocab, generator=gen) * 2.0
    logits = row.expand(trials, vocab).contiguous()

    def full(value: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.full((trials,), value, dtype=dtype)

    args = (
        full(temperature, torch.float32),
        full(top_k, torch.int64),
        full(top_p, torch.float32),
        full(min_p, torch.float32),
    )
    want = sampling_probs_reference(row, *(a[:1] for a in args))[0]
    tokens = torch.as_tensor(sample_fn(logits, *args, generator=gen)).flatten().cpu()
    outside = tokens[want[tokens.clamp(0, vocab - 1)] == 0]
    if outside.numel() or bool(((tokens < 0) | (tokens >= vocab)).any()):
        raise AssertionError(
            f"check_sampler: drew tokens outside the kept support {outside[:8].tolist()} "
            f"(top_k={top_k}, top_p={top_p}, min_p={min_p}, seed={seed})"
        )
    p_value = chi_square_p_value(tokens, want)
    if p_value <= alpha:
        raise AssertionError(
            f"check_sampler: draws do not follow the filtered distribution (p = {p_value:.2e};"
            f" top_k={top_k}, top_p={top_p}, min_p={min_p}, trials={trials}, seed={seed})"
        )
    return p_value
