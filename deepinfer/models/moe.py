"""DeepSeek's mixture-of-experts layer: routed experts (grouped top-k) plus shared experts.

Routing runs on ``deepinfer_kernels.moe_route`` (fp32 router logits; sigmoid scores with the
selection-only correction bias for V3, softmax for V2) and the routed experts on
``fused_moe`` (tokens sorted by expert, one GEMM pair per expert). Expert weights are stacked
``[E, 2I, H]`` (gate rows, then up rows) and ``[E, H, I]``, as ``fused_moe`` takes them.
"""

from __future__ import annotations

import torch
from torch import nn

import deepinfer_kernels
from deepinfer.models.deepseek_config import DeepseekConfig
from deepinfer.models.llama import LlamaMLP


class MoERouter(nn.Module):
    """``weight [E, hidden]`` (kept fp32, as Hugging Face does) and, for sigmoid scoring,
    ``e_score_correction_bias [E]``."""

    def __init__(self, config: DeepseekConfig) -> None:
        super().__init__()
        experts = config.n_routed_experts
        self.weight = nn.Parameter(torch.empty(experts, config.hidden_size))
        self.e_score_correction_bias: nn.Parameter | None = (
            nn.Parameter(torch.zeros(experts)) if config.scoring_func == "sigmoid" else None
        )


class DeepseekMoE(nn.Module):
    def __init__(self, config: DeepseekConfig) -> None:
        super().__init__()
        e, i, h = config.n_routed_experts, config.moe_intermediate_size, config.hidden_size
        self.config = config
        self.gate = MoERouter(config)
        self.w_gate_up = nn.Parameter(torch.empty(e, 2 * i, h))
        self.w_down = nn.Parameter(torch.empty(e, h, i))
        self.shared_experts: LlamaMLP | None = (
            LlamaMLP(config, i * config.n_shared_experts) if config.n_shared_experts else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., hidden]``: the weighted routed experts plus the shared experts."""
        cfg = self.config
        flat = x.reshape(-1, x.shape[-1])
        logits = flat.float() @ self.gate.weight.float().t()
        bias = self.gate.e_score_correction_bias
        weights, ids = deepinfer_kernels.moe_route(
            logits,
            cfg.num_experts_per_tok,
            scoring=cfg.scoring_func,
            n_group=cfg.n_group,
            topk_group=cfg.topk_group,
            routed_scaling_factor=cfg.routed_scaling_factor,
            correction_bias=None if bias is None else bias.float(),
            renormalize=cfg.norm_topk_prob,
        )
        # The ids come from moe_route: in range by construction, no need for the value check
        # (a host sync on CUDA).
        out: torch.Tensor = deepinfer_kernels.fused_moe(
            flat, self.w_gate_up, self.w_down, weights, ids, check_values=False
        )
        if self.shared_experts is not None:
            out = out + self.shared_experts.forward(flat)
        return out.view(x.shape)
