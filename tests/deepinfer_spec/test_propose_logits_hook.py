"""``propose(logits_hook=...)``: a mask applied while drafting changes what is drawn and the
reported ``probs`` together, so verification stays lossless."""

from __future__ import annotations

import torch
from conftest import make_drafter

from deepinfer_spec import propose
from deepinfer_spec.recompute_target import RecomputeTarget


def _context(drafter, batch: int, seed: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(batch, 8, drafter.feature_dim, generator=g)
    return drafter.project_context(raw).detach(), torch.ones(batch, 8, dtype=torch.bool)


def test_masked_drafts_and_probs(target: RecomputeTarget) -> None:
    d = make_drafter(target)
    allowed = torch.zeros(32, dtype=torch.bool)
    allowed[[3, 4, 9, 20]] = True
    calls: list[tuple[int, tuple[int, ...]]] = []

    def hook(k: int, prefix: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        calls.append((k, tuple(prefix.shape)))
        return logits.masked_fill(~allowed, float("-inf"))

    n = 3000
    ctx, valid = _context(d, 1, 0)
    args = (d, torch.full((n,), 7), ctx.expand(n, -1, -1), valid.expand(n, -1))
    draft = propose(*args, generator=torch.Generator().manual_seed(1), logits_hook=hook)
    assert calls == [(k, (n, k)) for k in range(d.config.gamma)]
    assert bool(allowed[draft.token_ids].all())
    assert float(draft.probs[..., ~allowed].abs().max()) == 0.0
    # probs is the masked softmax of the unmasked run's logits (same backbone, same first draw
    # position), and the first tokens follow it.
    free = propose(*args, generator=torch.Generator().manual_seed(1))
    p0 = torch.where(allowed, free.probs[0, 0], 0.0)
    torch.testing.assert_close(draft.probs[0, 0], p0 / p0.sum(), rtol=1e-5, atol=1e-6)
    counts = torch.bincount(draft.token_ids[:, 0], minlength=32).float()
    keep = p0 / p0.sum() * n >= 5
    expected = n * draft.probs[0, 0]
    stat = float((((counts - expected) ** 2) / expected)[keep].sum())
    assert stat < 20.0  # chi2 99.9% quantile for 3 degrees of freedom is ~16.3
    greedy = propose(*args[:1], *(a[:2] for a in args[1:]), temperature=0.0, logits_hook=hook)
    assert bool(allowed[greedy.token_ids].all())
