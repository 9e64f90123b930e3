"""Torch path of ``fused_moe``: pairs sorted by expert, one GEMM pair per expert with tokens.

Per expert the gathered rows run ``x @ W_gate_up.T`` -> SwiGLU -> ``@ W_down.T`` and the
weighted rows are added into an fp32 output with ``index_add_``. Experts without tokens are
skipped, which needs the per-expert counts on the host (one sync; the Triton path has none).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` on the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def fused_moe_torch(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    top_k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids.clamp(min=-1) + 1, minlength=w_gate_up.shape[0] + 1)
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    weights = topk_weights.reshape(-1).float()
    # Low-precision matmuls on CPU are slow and round the accumulator; products run in fp32.
    compute = torch.float32 if hidden.device.type == "cpu" else hidden.dtype
    start = int(counts[0])  # pairs routed to -1 sort first and are skipped
    for expert, count in enumerate(counts[1:].tolist()):
        if count == 0:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        x = hidden.index_select(0, tokens).to(compute)
        act = swiglu(x @ w_gate_up[expert].to(compute).t()).to(hidden.dtype)
        y = act.to(compute) @ w_down[expert].to(compute).t()
        out.index_add_(0, tokens, y.float() * weights[pairs, None])
    return out.to(hidden.dtype)
