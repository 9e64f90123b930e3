# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels for KV movement: slot writes and whole-page gathers/scatters.

Each kernel is a masked row copy; indices outside the destination or source are skipped, so an
unchecked call never touches memory outside the tensors. Offsets are 64-bit (large pools).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deepinfer_kernels._dispatch import interpreter_active
from deepinfer_kernels.kv.write import write_kv_torch


@triton.jit
def _write_rows_kernel(
    src_ptr, dst_ptr, slot_ptr,
    T, INNER, NUM_SLOTS, BLOCK_SIZE,
    s_src_t, s_dst_b, s_dst_o,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
    slot = tl.load(slot_ptr + toks, mask=toks < T, other=-1).to(tl.int64)
    ok = (toks < T) & (slot >= 0) & (slot < NUM_SLOTS)
    m2 = ok[:, None] & (cols < INNER)[None, :]
    x = tl.load(src_ptr + toks.to(tl.int64)[:, None] * s_src_t + cols[None, :], mask=m2)
    dst = dst_ptr + (slot // BLOCK_SIZE) * s_dst_b + (slot % BLOCK_SIZE) * s_dst_o
    tl.store(dst[:, None] + cols[None, :], x.to(dst_ptr.dtype.element_ty), mask=m2)


def _trailing_contiguous(t: torch.Tensor, start: int) -> bool:
    """True when dims ``start..`` of ``t`` are laid out densely (so they flatten to one)."""
    expected = 1
    for size, stride in zip(reversed(t.shape[start:]), reversed(t.stride()[start:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _tiles(rows: int, inner: int) -> tuple[int, int]:
    block_c = min(triton.next_power_of_2(max(inner, 1)), 1024)
    if interpreter_active():
        return min(triton.next_power_of_2(max(rows, 1)), 256), block_c
    return (4 if inner >= 256 else 32), block_c


def _write_one(src: torch.Tensor, dst: torch.Tensor, slots: torch.Tensor) -> None:
    tokens = src.shape[0]
    inner = math.prod(dst.shape[2:])
    src2 = src.reshape(tokens, inner)
    if src2.stride(-1) != 1:
        src2 = src2.contiguous()
    block_t, block_c = _tiles(tokens, inner)
    grid = (triton.cdiv(tokens, block_t), triton.cdiv(inner, block_c))
    _write_rows_kernel[grid](
        src2, dst, slots,
        tokens, inner, dst.shape[0] * dst.shape[1], dst.shape[1],
        src2.stride(0), dst.stride(0), dst.stride(1),
        BLOCK_T=block_t, BLOCK_C=block_c,
    )  # fmt: skip


def write_kv_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if k.shape[0] == 0:
        return
    if not (_trailing_contiguous(k_cache, 2) and _trailing_contiguous(v_cache, 2)):
        write_kv_torch(k, v, k_cache, v_cache, slot_mapping)
        return
    slots = slot_mapping.to(torch.int64).contiguous()
    # Casting here (round-to-nearest-even, as torch does) keeps the kernel a pure copy.
    _write_one(k.to(k_cache.dtype), k_cache, slots)
    _write_one(v.to(v_cache.dtype), v_cache, slots)


@triton.jit
def _move_blocks_kernel(
    src_ptr, dst_ptr, ids_ptr,
    N, NB_SRC, NB_DST, INNER,
    GATHER: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    outer = tl.program_id(1).to(tl.int64)
    cols = (tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
    # The id is broadcast to a vector so that every mask has the vector shape.
    block = tl.zeros([BLOCK_C], dtype=tl.int64) + tl.load(ids_ptr + i).to(tl.int64)
    here = tl.zeros([BLOCK_C], dtype=tl.int64) + i
    if GATHER:
        src_row, dst_row = block, here
        ok = (block >= 0) & (block < NB_SRC)
    else:
        src_row, dst_row = here, block
        ok = (block >= 0) & (block < NB_DST)
    m = (cols < INNER) & ok
    x = tl.load(src_ptr + (outer * NB_SRC + src_row) * INNER + cols, mask=m, other=0)
    tl.store(dst_ptr + (outer * NB_DST + dst_row) * INNER + cols, x, mask=m)


def _launch_move(
    src: torch.Tensor, dst: torch.Tensor, ids: torch.Tensor, block_dim: int, gather: bool
) -> None:
    n = ids.shape[0]
    outer = math.prod(src.shape[:block_dim])
    inner = math.prod(src.shape[block_dim + 1 :])
    if n == 0 or outer == 0 or inner == 0:
        return
    block_c = min(triton.next_power_of_2(inner), 1024 if interpreter_active() else 4096)
    grid = (n, outer, triton.cdiv(inner, block_c))
    _move_blocks_kernel[grid](
        src, dst, ids, n, src.shape[block_dim], dst.shape[block_dim], inner,
        GATHER=gather, BLOCK_C=block_c,
    )  # fmt: skip


def gather_blocks_triton(
    cache: torch.Tensor, block_ids: torch.Tensor, block_dim: int
) -> torch.Tensor:
    """Contiguous ``cache`` only (the op falls back to ``index_select`` otherwise)."""
    shape = list(cache.shape)
    shape[block_dim] = block_ids.shape[0]
    out = torch.empty(shape, dtype=cache.dtype, device=cache.device)
    _launch_move(cache, out, block_ids.to(torch.int64).contiguous(), block_dim, gather=True)
    return out


def scatter_blocks_triton(
    cache: torch.Tensor, block_ids: torch.Tensor, src: torch.Tensor, block_dim: int
) -> None:
    """Contiguous ``cache`` and ``src`` only."""
    _launch_move(src, cache, block_ids.to(torch.int64).contiguous(), block_dim, gather=False)
