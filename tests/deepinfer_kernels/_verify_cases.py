"""Random verification problems shared by the verification, sampling and KV tests."""

from __future__ import annotations

import torch


def random_dist(
    shape: tuple[int, ...], gen: torch.Generator, zero_frac: float = 0.0
) -> torch.Tensor:
    """Rows of random probabilities; a fraction of entries is zeroed (one entry always kept)."""
    w = torch.rand(shape, generator=gen) ** 2
    if zero_frac > 0:
        w = torch.where(torch.rand(shape, generator=gen) < zero_frac, 0.0, w)
        keep = torch.randint(0, shape[-1], shape[:-1], generator=gen)
        w.scatter_(-1, keep.unsqueeze(-1), 1.0)
    return w / w.sum(-1, keepdim=True)


def random_problem(
    batch: int,
    gamma: int,
    vocab: int,
    seed: int,
    zero_frac: float = 0.0,
    pad: int = -1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(draft_ids, draft_probs, target_probs, num_draft_tokens)`` with drafts sampled from
    ``draft_probs``, ragged counts and padding ``pad`` beyond each count."""
    gen = torch.Generator().manual_seed(seed)
    p_t = random_dist((batch, gamma + 1, vocab), gen, zero_frac)
    p_d = random_dist((batch, gamma, vocab), gen, zero_frac)
    ids = torch.multinomial(p_d.reshape(-1, vocab), 1, generator=gen).reshape(batch, gamma)
    n = torch.randint(0, gamma + 1, (batch,), generator=gen)
    ids = torch.where(torch.arange(gamma)[None, :] < n[:, None], ids, pad)
    return ids, p_d, p_t, n


def triton_device() -> str:
    """Where the Triton path runs in tests: the GPU if present, else the CPU interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"
