"""``torch.library`` custom ops for MoE routing and experts, with fake implementations.

The ops take validated tensors and resolved options; users call the wrappers in
:mod:`deepinfer_kernels.moe.api`.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.moe.route import moe_route_torch
from deepinfer_kernels.moe.torch_moe import fused_moe_torch


def moe_route_impl(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    sigmoid: bool,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return moe_route_torch(
        router_logits, correction_bias, top_k, sigmoid, n_group, topk_group,
        routed_scaling_factor, renormalize,
    )  # fmt: skip


moe_route_op = torch.library.custom_op("deepinfer::moe_route", moe_route_impl, mutates_args=())


@moe_route_op.register_fake
def _(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    sigmoid: bool,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = router_logits.shape[0]
    return (
        router_logits.new_empty((rows, top_k), dtype=torch.float32),
        router_logits.new_empty((rows, top_k), dtype=torch.int32),
    )


def fused_moe_impl(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    use_triton: bool,
) -> torch.Tensor:
    if use_triton:
        from deepinfer_kernels.moe.triton_moe import fused_moe_triton

        return fused_moe_triton(hidden, w_gate_up, w_down, topk_weights, topk_ids)
    return fused_moe_torch(hidden, w_gate_up, w_down, topk_weights, topk_ids)


fused_moe_op = torch.library.custom_op("deepinfer::fused_moe", fused_moe_impl, mutates_args=())


@fused_moe_op.register_fake
def _(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    use_triton: bool,
) -> torch.Tensor:
    return torch.empty_like(hidden)
