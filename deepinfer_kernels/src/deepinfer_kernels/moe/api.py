"""Public MoE ops: validation, DLPack interop and dispatch around the custom ops."""

from __future__ import annotations

from typing import Any

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.moe.ops import fused_moe_impl, fused_moe_op, moe_route_impl, moe_route_op
from deepinfer_kernels.moe.validate import (
    check_fused_moe,
    check_fused_moe_values,
    check_route,
    check_route_values,
    want_value_checks,
)


def moe_route(
    router_logits: Any,
    top_k: int,
    *,
    scoring: str = "softmax",
    n_group: int = 1,
    topk_group: int | None = None,
    routed_scaling_factor: float = 1.0,
    correction_bias: Any = None,
    renormalize: bool = False,
    check_values: bool = True,
) -> tuple[Any, Any]:
    """Pick ``top_k`` experts per token from ``router_logits [tokens, experts]``.

    ``scoring`` turns logits into scores (``"softmax"``: Mixtral, Qwen-MoE, DeepSeek-V2;
    ``"sigmoid"``: DeepSeek-V3). With ``n_group > 1`` the experts form ``n_group`` contiguous
    groups and only the best ``topk_group`` groups stay eligible; a group's score is its best
    expert's, or with ``correction_bias`` the sum of its best two (DeepSeek-V3's grouped
    top-k). ``correction_bias [experts]`` is added for selection only: the weights are the
    unbiased scores, divided by their sum when ``renormalize``, times
    ``routed_scaling_factor``. Equal scores rank the lower expert (or group) index first.

    Returns ``(topk_weights fp32, topk_ids int32)``, both ``[tokens, top_k]``, ids in
    decreasing order of selection score.
    """
    convert = result_converter(router_logits, correction_bias)
    logits = to_torch(router_logits, "router_logits")
    bias = to_torch(correction_bias, "correction_bias")
    opts = check_route(
        logits, top_k, scoring, n_group, topk_group, routed_scaling_factor, bias, renormalize
    )
    if want_value_checks(check_values):
        check_route_values(logits, bias)
    weights, ids = eager_or_op(moe_route_op, moe_route_impl)(
        logits, bias, opts.top_k, opts.scoring == "sigmoid", opts.n_group, opts.topk_group,
        opts.routed_scaling_factor, opts.renormalize,
    )  # fmt: skip
    return convert(weights), convert(ids)


def fused_moe(
    hidden: Any,
    w_gate_up: Any,
    w_down: Any,
    topk_weights: Any,
    topk_ids: Any,
    *,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> Any:
    """Routed experts with SwiGLU: ``hidden [T, H]``, ``w_gate_up [E, 2I, H]`` (gate rows
    first, then up), ``w_down [E, H, I]``, ``topk_weights``/``topk_ids [T, k]`` (as from
    :func:`moe_route`; id ``-1`` skips the slot, e.g. an expert on another rank).

    ``out[t] = sum_j w[t,j] * W_down[e] @ (silu(W_gate[e] @ h) * (W_up[e] @ h))`` with
    ``e = topk_ids[t, j]``: fp32 accumulation, the activation rounded to ``hidden``'s dtype
    before the down projection, output in ``hidden``'s dtype. The (token, slot) pairs are
    sorted by expert and each expert runs one GEMM pair over its rows (Triton on CUDA: grouped
    GEMM kernels, no atomics).
    """
    convert = result_converter(hidden, w_gate_up, w_down, topk_weights, topk_ids)
    h = to_torch(hidden, "hidden")
    gu, down = to_torch(w_gate_up, "w_gate_up"), to_torch(w_down, "w_down")
    tw, ti = to_torch(topk_weights, "topk_weights"), to_torch(topk_ids, "topk_ids")
    check_fused_moe(h, gu, down, tw, ti)
    if want_value_checks(check_values):
        check_fused_moe_values(ti, gu.shape[0])
    triton = should_use_triton(h.device, use_triton)
    return convert(eager_or_op(fused_moe_op, fused_moe_impl)(h, gu, down, tw, ti, triton))
