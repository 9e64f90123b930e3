"""Torch path of ``moe_route``: batched, no host sync, deterministic ties.

``torch.topk`` leaves the order of equal values unspecified; a stable descending sort keeps
the lower index first, which is the documented tie-break, at a cost that does not matter for
router widths (tens to a few hundred experts).
"""

from __future__ import annotations

import torch


def _top_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]


def moe_route_torch(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    sigmoid: bool,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = router_logits.float()
    scores = logits.sigmoid() if sigmoid else logits.softmax(-1)
    sel = scores if correction_bias is None else scores + correction_bias.float()
    num_tokens, num_experts = scores.shape
    if n_group > 1 and topk_group < n_group:
        grouped = sel.view(num_tokens, n_group, num_experts // n_group)
        if correction_bias is not None:
            # DeepSeek-V3 ranks a group by the sum of its two best biased scores.
            best = torch.sort(grouped, dim=-1, descending=True).values[..., :2]
            group_scores = best.sum(-1)
        else:
            group_scores = grouped.amax(-1)
        keep = torch.zeros(num_tokens, n_group, dtype=torch.bool, device=sel.device)
        keep.scatter_(1, _top_indices(group_scores, topk_group), True)
        sel = grouped.masked_fill(~keep[..., None], float("-inf")).view(num_tokens, num_experts)
    ids = _top_indices(sel, top_k)
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids.to(torch.int32)
