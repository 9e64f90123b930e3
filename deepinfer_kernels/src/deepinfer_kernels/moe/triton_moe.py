# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton grouped expert GEMMs for ``fused_moe`` (pairs sorted by expert, see ``align.py``).

Kernel 1, grid ``(row_blocks, cdiv(I, BLOCK_N))``: a block of ``BLOCK_M`` sorted rows, all of
one expert, gathers its tokens' hidden rows and computes ``silu(x W_gate^T) * (x W_up^T)`` for
``BLOCK_N`` intermediate columns, fp32 accumulation, stored in the input dtype. Kernel 2, grid
``(row_blocks, cdiv(H, BLOCK_N))``: ``act W_down^T`` times the pair's routing weight, written
to the pair's own row of ``[P, H]`` (fp32); the ``top_k`` rows of a token are summed after.
No atomics, so results are deterministic. Blocks past the last expert segment exit at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._dispatch import interpreter_active
from deepinfer_kernels.launch_configs import moe_launch
from deepinfer_kernels.moe.align import align_by_expert


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, act_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, num_experts, hidden_size, inter,
    stride_xt, stride_we, stride_wn, stride_act,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert >= num_experts:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < num_pairs
    token = (pair // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < inter
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w_ptr + expert * stride_we
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < hidden_size
        x = tl.load(
            x_ptr + token[:, None] * stride_xt + kk[None, :],
            mask=row_ok[:, None] & k_ok[None, :], other=0.0,
        )  # fmt: skip
        wmask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(w_base + offs_n[None, :] * stride_wn + kk[:, None], mask=wmask, other=0.0)
        wu = tl.load(
            w_base + (offs_n[None, :] + inter) * stride_wn + kk[:, None], mask=wmask, other=0.0
        )
        if UPCAST:
            x, wg, wu = x.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
        acc_g = tl.dot(x, wg, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(x, wu, acc_u, input_precision=PRECISION)
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(
        act_ptr + rows.to(tl.int64)[:, None] * stride_act + offs_n[None, :],
        act.to(act_ptr.dtype.element_ty),
        mask=row_ok[:, None] & n_ok[None, :],
    )


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, num_experts, hidden_size, inter,
    stride_act, stride_we, stride_wn, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert >= num_experts:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden_size
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w_ptr + expert * stride_we
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < inter
        a = tl.load(
            act_ptr + rows.to(tl.int64)[:, None] * stride_act + kk[None, :],
            mask=row_ok[:, None] & k_ok[None, :], other=0.0,
        )  # fmt: skip
        w = tl.load(
            w_base + offs_n[None, :] * stride_wn + kk[:, None],
            mask=k_ok[:, None] & n_ok[None, :], other=0.0,
        )  # fmt: skip
        if UPCAST:
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    gate = tl.load(weights_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
    acc = acc * gate[:, None]
    tl.store(
        out_ptr + pair.to(tl.int64)[:, None] * stride_out + offs_n[None, :],
        acc,
        mask=row_ok[:, None] & n_ok[None, :],
    )


def fused_moe_triton(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    num_tokens, top_k = topk_ids.shape
    num_experts, two_inter, hidden_size = w_gate_up.shape
    inter = two_inter // 2
    hidden = hidden.contiguous()
    w_gate_up, w_down = w_gate_up.contiguous(), w_down.contiguous()
    num_pairs = num_tokens * top_k
    launch = moe_launch(num_pairs, num_experts, hidden.dtype == torch.float32)
    block_m, block_n, block_k = launch["BLOCK_M"], launch["BLOCK_N"], launch["BLOCK_K"]
    layout = align_by_expert(topk_ids, num_experts, block_m)
    rows = layout.sorted_pairs.numel()
    act = torch.empty(rows, inter, dtype=hidden.dtype, device=hidden.device)
    out_pairs = torch.zeros(num_pairs, hidden_size, dtype=torch.float32, device=hidden.device)
    if num_pairs == 0:
        return torch.zeros_like(hidden)
    weights = topk_weights.reshape(-1).float().contiguous()
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    upcast = hidden.dtype == torch.bfloat16 and interpreter_active()
    row_blocks = rows // block_m
    _gate_up_kernel[(row_blocks, triton.cdiv(inter, block_n))](
        hidden, w_gate_up, act, layout.sorted_pairs, layout.block_expert,
        num_pairs, num_experts, hidden_size, inter,
        hidden.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0),
        TOP_K=top_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        PRECISION=precision, UPCAST=upcast,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    _down_kernel[(row_blocks, triton.cdiv(hidden_size, block_n))](
        act, w_down, out_pairs, weights, layout.sorted_pairs, layout.block_expert,
        num_pairs, num_experts, hidden_size, inter,
        act.stride(0), w_down.stride(0), w_down.stride(1), out_pairs.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        PRECISION=precision, UPCAST=upcast,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    return out_pairs.view(num_tokens, top_k, hidden_size).sum(1).to(hidden.dtype)
