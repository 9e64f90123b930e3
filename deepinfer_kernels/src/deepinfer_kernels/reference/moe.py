"""Reference mixture-of-experts routing and expert computation: the specification the torch
path and the Triton kernels meet. Loops over tokens on purpose: meant to be read, not fast.

Routing of one token with router logits ``x [E]``::

    s      = softmax(x)  or  sigmoid(x)                        (fp32)
    sel    = s + correction_bias                               (selection score only)
    groups : E experts in n_group contiguous groups; a group's score is the sum of its two
             best ``sel`` (with a correction bias, DeepSeek-V3) or its best ``sel`` (without);
             only the experts of the best ``topk_group`` groups stay eligible
    ids    = the top_k eligible experts by ``sel``
    w      = s[ids]                                            (unbiased scores)
    w      = w / sum(w)                                        (if renormalize)
    w      = w * routed_scaling_factor

Ties rank the lower index first, for groups and for experts. Experts ``fused_moe`` computes
(SwiGLU, ``w_gate_up[e] = [gate; up]``)::

    out[t] = sum_j w[t, j] * W_down[e_j] @ round(silu(W_gate[e_j] @ h) * (W_up[e_j] @ h))

with fp32 products and the activation rounded to the input dtype before the down projection
(what a model running in that dtype does); ``e_j = -1`` contributes nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _ranked(values: list[float]) -> list[int]:
    """Indices by decreasing value, lower index first among equals."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))


def moe_route(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    n_group: int = 1,
    topk_group: int | None = None,
    routed_scaling_factor: float = 1.0,
    correction_bias: torch.Tensor | None = None,
    renormalize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`deepinfer_kernels.moe_route`: ``(weights fp32, ids int32)``, both
    ``[tokens, top_k]``."""
    logits = router_logits.float()
    scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
    num_tokens, num_experts = scores.shape
    per_group = num_experts // n_group
    keep_groups = n_group if topk_group is None else topk_group
    bias = None if correction_bias is None else correction_bias.float()
    weights = torch.zeros(num_tokens, top_k, dtype=torch.float32)
    ids = torch.zeros(num_tokens, top_k, dtype=torch.int32)
    for t in range(num_tokens):
        s = scores[t]
        sel = (s + bias if bias is not None else s).tolist()
        group_scores = []
        for g in range(n_group):
            members = sorted(sel[g * per_group : (g + 1) * per_group], reverse=True)
            # fp32 addition, as the kernels rank groups.
            top2 = float(torch.tensor(members[:2], dtype=torch.float32).sum())
            group_scores.append(top2 if bias is not None else members[0])
        eligible = {
            e
            for g in _ranked(group_scores)[:keep_groups]
            for e in range(g * per_group, (g + 1) * per_group)
        }
        chosen = [e for e in _ranked(sel) if e in eligible][:top_k]
        w = s[chosen].clone()
        if renormalize:
            w = w / w.sum()
        weights[t] = w * routed_scaling_factor
        ids[t] = torch.tensor(chosen, dtype=torch.int32)
    return weights.to(router_logits.device), ids.to(router_logits.device)


def fused_moe(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Reference of :func:`deepinfer_kernels.fused_moe`: one token and one expert at a time."""
    inter = w_down.shape[-1]
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for t in range(hidden.shape[0]):
        h = hidden[t].float()
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if e < 0:
                continue
            gate_up = w_gate_up[e].float() @ h
            act = F.silu(gate_up[:inter]) * gate_up[inter:]
            act = act.to(hidden.dtype).float()
            out[t] += float(topk_weights[t, j]) * (w_down[e].float() @ act)
    return out.to(hidden.dtype)
