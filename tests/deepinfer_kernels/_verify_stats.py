"""Statistical losslessness checks shared by the torch and Triton verification tests.

``verify`` is any callable with the ``speculative_verify`` signature.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from _stats import assert_matches
from _verify_cases import random_dist

from deepinfer_kernels.verify.types import VerifyResult

Verify = Callable[..., VerifyResult]


def check_first_token(
    verify: Verify, trials: int, vocab: int, gamma: int, seed: int, zero_frac: float, one_hot: bool
) -> None:
    """The first emitted token is distributed as ``p_t[0]``, for ragged ``num_draft_tokens``."""
    gen = torch.Generator().manual_seed(seed)
    p_t = random_dist((1, gamma + 1, vocab), gen, zero_frac)
    p_d = random_dist((1, gamma, vocab), gen, zero_frac)
    if one_hot:
        # A deterministic drafter: its token per position is fixed, drawn once.
        ids = torch.multinomial(p_d[0], 1, generator=gen).T.expand(trials, gamma)
        draft = None
    else:
        ids = torch.multinomial(p_d[0], trials, replacement=True, generator=gen).T
        draft = p_d.expand(trials, gamma, vocab)
    n = torch.randint(0, gamma + 1, (trials,), generator=gen)
    ids = torch.where(torch.arange(gamma)[None] < n[:, None], ids, -1)
    res = verify(ids, draft, p_t.expand(trials, gamma + 1, vocab), n, generator=gen)
    assert_matches(res.output_ids[:, 0], p_t[0, 0])


def check_first_two_tokens(
    verify: Verify, trials: int, vocab: int, seed: int, zero_frac: float
) -> None:
    """The first two tokens of the generated text follow ``p_t0(a) * P1[a, b]``.

    Target row 1 is conditioned on the draft token at position 0 (as a real target forward
    is); when a step emits one token only, a second step (no drafts, bonus only) continues
    from the emitted token, exactly as an engine would.
    """
    gamma = 2
    gen = torch.Generator().manual_seed(seed)
    p_t0 = random_dist((vocab,), gen, zero_frac)
    p_t1 = random_dist((vocab, vocab), gen, zero_frac)  # p_t(. | a)
    p_t2 = random_dist((vocab, vocab), gen, zero_frac)  # position 2 given token 1 (unused here)
    p_d0 = random_dist((vocab,), gen, zero_frac)
    p_d1 = random_dist((vocab, vocab), gen, zero_frac)
    x0 = torch.multinomial(p_d0, trials, replacement=True, generator=gen)
    x1 = torch.multinomial(p_d1[x0], 1, generator=gen).squeeze(1)
    ids = torch.stack([x0, x1], dim=1)
    draft = torch.stack([p_d0.expand(trials, vocab), p_d1[x0]], dim=1)
    target = torch.stack([p_t0.expand(trials, vocab), p_t1[x0], p_t2[x1]], dim=1)
    n = torch.randint(0, gamma + 1, (trials,), generator=gen)
    ids = torch.where(torch.arange(gamma)[None] < n[:, None], ids, -1)
    res = verify(ids, draft, target, n, generator=gen)
    first = res.output_ids[:, 0]
    second = res.output_ids[:, 1].clone()
    single = res.num_emitted == 1
    m = int(single.sum())
    if m:
        follow = verify(
            torch.full((m, gamma), -1, dtype=torch.int64),
            draft[:m],
            torch.stack([p_t1[first[single]]] * (gamma + 1), dim=1),
            torch.zeros(m, dtype=torch.int64),
            generator=gen,
        )
        second[single] = follow.output_ids[:, 0]
    joint = p_t0[:, None] * p_t1
    assert_matches(first * vocab + second, joint)
