"""Vectorised torch path for sampling: threshold filters computed from one sort per row."""

from __future__ import annotations

import torch

from deepinfer_kernels.sampling.categorical import inverse_cdf_sample


def sampling_probs_torch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Filtered, renormalised ``[B, V]`` float32 distribution; see ``reference.sampling``."""
    vocab = logits.shape[1]
    greedy = temperature == 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    probs = torch.softmax(logits.float() / temp[:, None], dim=-1)

    sorted_p = torch.sort(probs, dim=-1, descending=True).values
    k = torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k).to(torch.int64)
    kth = sorted_p.gather(1, (k - 1)[:, None])
    threshold = kth
    # Top-p over the top-k set: in sorted order that set is a prefix (ties are kept).
    in_k = sorted_p >= kth
    kept_sorted = torch.where(in_k, sorted_p, 0.0)
    cum = torch.cumsum(kept_sorted, dim=-1)
    mass = cum[:, -1:]
    reached = cum >= top_p[:, None] * mass
    first = torch.argmax(reached.to(torch.int8), dim=-1, keepdim=True)
    tau = sorted_p.gather(1, first)
    use_p = (top_p < 1)[:, None]
    threshold = torch.where(use_p, torch.maximum(threshold, tau), threshold)
    threshold = torch.maximum(threshold, min_p[:, None] * sorted_p[:, :1])

    filtered = torch.where(probs >= threshold, probs, 0.0)
    filtered = filtered / filtered.sum(dim=-1, keepdim=True)
    one_hot = torch.nn.functional.one_hot(torch.argmax(logits, dim=-1), vocab).float()
    return torch.where(greedy[:, None], one_hot, filtered)


def sample_torch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Inverse-CDF draw (index order) from ``sampling_probs_torch``; greedy rows get the argmax."""
    probs = sampling_probs_torch(logits, temperature, top_k, top_p, min_p)
    tokens = inverse_cdf_sample(probs, uniforms)
    greedy_tokens = torch.argmax(logits, dim=-1)
    return torch.where(temperature == 0, greedy_tokens, tokens)
