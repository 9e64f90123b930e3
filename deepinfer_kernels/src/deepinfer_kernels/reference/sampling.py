"""Readable per-row sampling filters: the specification of ``sample`` and ``sampling_probs``."""

from __future__ import annotations

import torch

from deepinfer_kernels.sampling.categorical import inverse_cdf_sample


def sampling_probs_reference(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """The distribution ``sample`` draws from, row by row.

    * ``temperature == 0``: one-hot at the first maximal logit.
    * otherwise ``p = softmax(logits / temperature)``, then three filters, each keeping the
      tokens whose probability is at least a threshold (so ties at a threshold are all kept):
      top-k keeps ``p >= (k-th largest p)`` (disabled when ``k <= 0`` or ``k >= V``); top-p keeps
      ``p >= tau`` for the largest ``tau`` whose kept mass ``sum(p[p >= tau])`` reaches
      ``top_p`` times the top-k mass (disabled when ``top_p >= 1``); min-p keeps
      ``p >= min_p * max(p)`` (disabled when ``min_p == 0``). The kept entries are renormalised.
    """
    batch, vocab = logits.shape
    out = torch.zeros(batch, vocab, dtype=torch.float32)
    for b in range(batch):
        row = logits[b].to(torch.float32)
        temp = float(temperature[b])
        if temp == 0.0:
            best = 0
            for i in range(vocab):
                if float(row[i]) > float(row[best]):
                    best = i
            out[b, best] = 1.0
            continue
        p = torch.softmax(row / temp, dim=-1)
        keep = torch.ones(vocab, dtype=torch.bool)
        k = int(top_k[b])
        if 0 < k < vocab:
            kth = torch.sort(p, descending=True).values[k - 1]
            keep &= p >= kth
        tp = float(top_p[b])
        if tp < 1.0:
            kept = torch.where(keep, p, torch.zeros_like(p))
            mass = float(kept.sum())
            ordered = torch.sort(kept, descending=True).values
            running = 0.0
            tau = float(ordered[0])
            for value in ordered.tolist():
                running += value
                tau = value
                if running >= tp * mass:
                    break
            keep &= p >= tau
        mp = float(min_p[b])
        if mp > 0.0:
            keep &= p >= mp * float(p.max())
        kept = torch.where(keep, p, torch.zeros_like(p))
        out[b] = kept / kept.sum()
    return out


def sample_reference(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """One token per row: the inverse-CDF draw with ``uniforms[b]`` from the filtered row."""
    probs = sampling_probs_reference(logits, temperature, top_k, top_p, min_p)
    return inverse_cdf_sample(probs, uniforms)
