"""Mixture-of-experts: routing (softmax/sigmoid, DeepSeek-V3 grouped top-k) and fused experts.

Example::

    import torch
    from deepinfer_kernels.moe import fused_moe, moe_route

    hidden = torch.randn(5, 64)
    w_gate_up = torch.randn(8, 2 * 32, 64) * 0.1  # [experts, 2 * intermediate, hidden]
    w_down = torch.randn(8, 64, 32) * 0.1  # [experts, hidden, intermediate]
    weights, ids = moe_route(torch.randn(5, 8), 2, renormalize=True)
    out = fused_moe(hidden, w_gate_up, w_down, weights, ids)  # [5, 64]
"""

from deepinfer_kernels.moe.align import ExpertLayout, align_by_expert
from deepinfer_kernels.moe.api import fused_moe, moe_route

__all__ = ["ExpertLayout", "align_by_expert", "fused_moe", "moe_route"]
