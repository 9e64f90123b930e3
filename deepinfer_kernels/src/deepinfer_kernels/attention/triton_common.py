# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Pieces shared by the Triton attention kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._dispatch import interpreter_active

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def soft_cap_logits(s, cap):
    """``cap * tanh(s / cap)`` with ``tanh(x) = 1 - 2 / (exp(2x) + 1)`` (saturates cleanly)."""
    x = s / cap
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0))


@triton.jit
def load_kv_tile(
    cache_ptr,
    block_table_ptr,
    bt_row,
    kpos,
    k_ok,
    kv_head,
    offs_d,
    d_ok,
    stride_b,
    stride_s,
    stride_h,
    num_blocks,
    max_blocks,
    BLOCK_SIZE: tl.constexpr,
    TRANSPOSED: tl.constexpr,
):
    """Gather key/value rows at absolute positions ``kpos`` of one sequence through its page
    table. Offsets are 64-bit so pools larger than 2**31 elements are addressed correctly.

    Returns ``(tile, readable)``: the tile is ``[D_PAD, BLOCK_N]`` when ``TRANSPOSED`` else
    ``[BLOCK_N, D_PAD]``; ``readable [BLOCK_N]`` is False where the position's block column is
    past the table (``max_blocks``) or its id is outside ``[0, num_blocks)``. Such rows are
    never read (zeros) and the caller must mask their logits: with value checks off this is
    what keeps a corrupt table from reading out of bounds (see ``invalid_blocks.py``)."""
    col = kpos // BLOCK_SIZE
    col_ok = k_ok & (col < max_blocks)
    phys = tl.load(block_table_ptr + bt_row + col, mask=col_ok, other=-1).to(tl.int64)
    readable = col_ok & (phys >= 0) & (phys < num_blocks)
    row = phys * stride_b + (kpos % BLOCK_SIZE).to(tl.int64) * stride_s + kv_head * stride_h
    if TRANSPOSED:
        ptrs = cache_ptr + row[None, :] + offs_d[:, None]
        tile = tl.load(ptrs, mask=readable[None, :] & d_ok[:, None], other=0.0)
    else:
        ptrs = cache_ptr + row[:, None] + offs_d[None, :]
        tile = tl.load(ptrs, mask=readable[:, None] & d_ok[None, :], other=0.0)
    return tile, readable


def next_pow2(n: int, at_least: int = 1) -> int:
    return max(at_least, int(triton.next_power_of_2(n)))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact products (no TF32) so fp32 results match the reference tightly."""
    return "ieee" if dtype == torch.float32 else "tf32"


def upcast_dot(dtype: torch.dtype) -> bool:
    """The Triton interpreter mishandles bf16 ``tl.dot``; there the tiles are upcast to fp32
    (loads, masking and stores still run in bf16). Compiled kernels use native bf16 dots."""
    return dtype == torch.bfloat16 and interpreter_active()


def on_interpreter() -> bool:
    return interpreter_active()
