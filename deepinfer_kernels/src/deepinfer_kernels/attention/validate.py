"""Input checks shared by the paged-attention ops.

Shape, dtype and device checks are static and always run. Value checks (negative lengths,
``seq_lens`` beyond the block table's capacity, ``q_len > seq_len``, block ids outside the
pool) read the index tensors, which costs a host sync on CUDA; they run unless the caller
passes ``check_values=False`` and are skipped while ``torch.compile`` traces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

ATTN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class PagedIndexShape(Protocol):
    """The sizes a paged call's index tensors are checked against (`PagedShape`, `MlaShape`)."""

    @property
    def batch(self) -> int: ...
    @property
    def total_q(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def max_blocks(self) -> int: ...


@dataclass(frozen=True)
class PagedShape:
    """Static sizes of one paged-attention call."""

    batch: int
    total_q: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int
    max_blocks: int

    @property
    def group(self) -> int:
        """Query heads per KV head (1 = MHA, ``num_q_heads`` = MQA)."""
        return self.num_q_heads // self.num_kv_heads


def want_value_checks(check_values: bool) -> bool:
    return check_values and not torch.compiler.is_compiling()


def _tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t)!r}")
    return t


def _index_tensor(t: object, name: str, shape: tuple[int, ...], device: torch.device) -> None:
    t = _tensor(t, name)
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} (same as q), got {t.device}")


def check_options(
    scale: float | None, sliding_window: int | None, soft_cap: float | None
) -> tuple[float | None, int, float]:
    """Validate the scalar options; returns them in op form (window -1 / cap 0 = off)."""
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale: expected a finite float or None, got {scale!r}")
    if scale is not None and scale <= 0:
        raise ValueError(f"scale: expected > 0, got {scale!r}")
    window = -1
    if sliding_window is not None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, int):
            raise ValueError(
                f"sliding_window: expected an int >= 1 or None, got {sliding_window!r}"
            )
        if sliding_window < 1:
            raise ValueError(f"sliding_window: expected >= 1, got {sliding_window}")
        window = sliding_window
    cap = 0.0
    if soft_cap is not None:
        if not isinstance(soft_cap, (int, float)) or not math.isfinite(soft_cap) or soft_cap <= 0:
            raise ValueError(f"soft_cap: expected a finite float > 0 or None, got {soft_cap!r}")
        cap = float(soft_cap)
    return (None if scale is None else float(scale)), window, cap


def check_paged_shapes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
) -> PagedShape:
    """Static checks; ``cu_seqlens_q=None`` means one query per sequence (decode)."""
    q = _tensor(q, "q")
    k_cache = _tensor(k_cache, "k_cache")
    v_cache = _tensor(v_cache, "v_cache")
    if q.dim() != 3:
        raise ValueError(
            f"q: expected [total_q, num_q_heads, head_dim], got shape {tuple(q.shape)}"
        )
    if q.dtype not in ATTN_DTYPES:
        raise ValueError(f"q: expected dtype float32, float16 or bfloat16, got {q.dtype}")
    if k_cache.dim() != 4:
        raise ValueError(
            "k_cache: expected [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(k_cache.shape)}"
        )
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(
            f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: expected dtype {q.dtype} (same as q), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (same as q), got {t.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: expected a unit stride on head_dim")
    total_q, hq, d = q.shape
    num_blocks, block_size, hkv, dk = k_cache.shape
    if dk != d:
        raise ValueError(f"k_cache: head_dim {dk} does not match q's head_dim {d}")
    if hkv < 1 or hq % hkv != 0:
        raise ValueError(
            f"q: num_q_heads {hq} must be a positive multiple of k_cache's num_kv_heads {hkv}"
        )
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"k_cache: block_size must be a power of two, got {block_size}")
    bt = _tensor(block_table, "block_table")
    if bt.dim() != 2:
        raise ValueError(f"block_table: expected [batch, max_blocks], got shape {tuple(bt.shape)}")
    batch = bt.shape[0]
    _index_tensor(block_table, "block_table", tuple(bt.shape), q.device)
    _index_tensor(seq_lens, "seq_lens", (batch,), q.device)
    if cu_seqlens_q is None:
        if total_q != batch:
            raise ValueError(f"q: expected one query per sequence ({batch} rows), got {total_q}")
    else:
        _index_tensor(cu_seqlens_q, "cu_seqlens_q", (batch + 1,), q.device)
    return PagedShape(batch, total_q, hq, hkv, d, num_blocks, block_size, bt.shape[1])


def check_paged_values(
    shape: PagedIndexShape,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    *,
    causal: bool = True,
) -> None:
    """Data-dependent checks (reads the index tensors). ``causal=False`` allows more queries
    than keys (a cascade pass of a batch's suffix queries over a shared prefix)."""
    if shape.batch == 0:
        return
    lens = seq_lens.to(torch.int64)
    if bool((lens < 0).any()):
        raise ValueError(f"seq_lens: expected non-negative lengths, got {seq_lens.tolist()}")
    capacity = shape.max_blocks * shape.block_size
    if bool((lens > capacity).any()):
        raise ValueError(
            f"seq_lens: {int(lens.max())} exceeds the block table's capacity "
            f"{shape.max_blocks} blocks x {shape.block_size} = {capacity} tokens"
        )
    if cu_seqlens_q is None:
        q_lens = torch.ones_like(lens)
    else:
        cu = cu_seqlens_q.to(torch.int64)
        if int(cu[0]) != 0 or int(cu[-1]) != shape.total_q:
            raise ValueError(
                f"cu_seqlens_q: expected to start at 0 and end at total_q={shape.total_q}, "
                f"got {cu_seqlens_q.tolist()}"
            )
        q_lens = cu[1:] - cu[:-1]
        if bool((q_lens < 0).any()):
            raise ValueError(f"cu_seqlens_q: expected non-decreasing offsets, got {cu.tolist()}")
    if causal and bool((q_lens > lens).any()):
        raise ValueError(
            "cu_seqlens_q: a sequence has more queries than KV positions (q_len > seq_len); "
            f"q_lens={q_lens.tolist()} seq_lens={seq_lens.tolist()}"
        )
    used = (lens + shape.block_size - 1) // shape.block_size
    cols = torch.arange(shape.max_blocks, device=lens.device)
    in_use = cols[None, :] < used[:, None]
    bad = in_use & ((block_table < 0) | (block_table >= shape.num_blocks))
    if bool(bad.any()):
        b, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"block_table: entry [{b}, {j}] = {int(block_table[b, j])} is outside the pool "
            f"of {shape.num_blocks} blocks"
        )
