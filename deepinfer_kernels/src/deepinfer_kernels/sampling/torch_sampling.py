"""Vectorised torch path for sampling: per-row thresholds, processed in cache-sized row blocks.

The kept set of a row is ``p >= max(t_k, t_p, t_min)`` (see ``reference.sampling``). Only the
largest ``K`` probabilities are ever needed to find ``t_k`` and ``t_p`` when every row that
uses top-p also uses top-k (``K`` = the largest such ``k``), so ``topk`` replaces a full sort
then; a full sort is done only for rows that ask for top-p alone.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.sampling.categorical import inverse_cdf_sample, row_chunks


def _kept_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """``softmax(logits / T)`` with the filtered-out entries set to 0 (not renormalised).

    Greedy rows (``T == 0``) are computed as if ``T == 1``; callers replace them.
    """
    vocab = logits.shape[1]
    temp = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    probs = torch.softmax(logits.float() / temp[:, None], dim=-1)
    k_on = (top_k > 0) & (top_k < vocab)
    p_on = top_p < 1
    if bool((p_on & ~k_on).any()):
        head = torch.sort(probs, dim=-1, descending=True).values
    elif bool(k_on.any()):
        head = torch.topk(probs, int(top_k[k_on].max()), dim=-1, sorted=True).values
    else:
        head = probs.amax(dim=-1, keepdim=True)
    width = head.shape[1]
    k_idx = (torch.where(k_on, top_k, width) - 1).clamp_(max=width - 1).to(torch.int64)
    kth = torch.where(k_on[:, None], head.gather(1, k_idx[:, None]), 0.0)
    threshold = torch.maximum(kth, min_p[:, None] * head[:, :1])
    if bool(p_on.any()):
        in_k = probs >= kth
        mass = torch.where(in_k, probs, 0.0).sum(dim=-1, keepdim=True)
        cum = torch.cumsum(torch.where(head >= kth, head, 0.0), dim=-1)
        reached = cum >= top_p[:, None] * mass
        first = torch.argmax(reached.to(torch.int8), dim=-1, keepdim=True)
        # Nothing reached inside the head: the rest of the top-k set ties with kth.
        tau = torch.where(reached.any(dim=-1, keepdim=True), head.gather(1, first), kth)
        threshold = torch.where(p_on[:, None], torch.maximum(threshold, tau), threshold)
    return torch.where(probs >= threshold, probs, 0.0)


def sampling_probs_torch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Filtered, renormalised ``[B, V]`` float32 distribution; greedy rows are one-hot."""
    batch, vocab = logits.shape
    out = torch.empty(batch, vocab, dtype=torch.float32, device=logits.device)
    for r in row_chunks(batch, vocab):
        kept = _kept_probs(logits[r], temperature[r], top_k[r], top_p[r], min_p[r])
        kept = kept / kept.sum(dim=-1, keepdim=True)
        one_hot = torch.nn.functional.one_hot(torch.argmax(logits[r], dim=-1), vocab).float()
        out[r] = torch.where((temperature[r] == 0)[:, None], one_hot, kept)
    return out


def sample_torch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Inverse-CDF draw in token order from the kept probabilities; greedy rows: argmax."""
    vocab = logits.shape[1]
    tokens = torch.argmax(logits, dim=-1)  # first maximal index: the greedy tie rule
    sampled = (temperature != 0).nonzero().squeeze(-1)
    if sampled.numel() == 0:
        return tokens
    for r in row_chunks(int(sampled.numel()), vocab):
        rows = sampled[r]
        kept = _kept_probs(logits[rows], temperature[rows], top_k[rows], top_p[rows], min_p[rows])
        tokens[rows] = inverse_cdf_sample(kept, uniforms[rows])
    return tokens
