"""Input checks for the MLA ops; every error names the argument at fault.

Static checks always run. Value checks (lengths, offsets, block ids, slots) read the index
tensors, which costs a host sync on CUDA; they run unless ``check_values=False`` and are
skipped while ``torch.compile`` traces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from deepinfer_kernels.attention.validate import check_paged_values

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def want_value_checks(check_values: bool) -> bool:
    return check_values and not torch.compiler.is_compiling()


def _tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t)!r}")
    return t


def _index(t: object, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    t = _tensor(t, name)
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} (as q_nope_absorbed), got {t.device}")
    return t


@dataclass(frozen=True)
class MlaShape:
    batch: int
    total_q: int
    num_heads: int
    kv_lora_rank: int
    rope_dim: int
    num_blocks: int
    block_size: int
    max_blocks: int


def check_scale(scale: object) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a float (e.g. qk_head_dim ** -0.5), got {scale!r}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale: expected a finite float > 0, got {scale!r}")
    return float(scale)


def check_latent_cache(cache: object, rank: int, rope: int, like: torch.Tensor) -> torch.Tensor:
    c = _tensor(cache, "latent_cache")
    if c.dim() != 3 or c.shape[2] != rank + rope:
        raise ValueError(
            "latent_cache: expected [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim = "
            f"{rank + rope}], got shape {tuple(c.shape)}"
        )
    if c.shape[1] < 1 or c.shape[1] & (c.shape[1] - 1):
        raise ValueError(f"latent_cache: block_size must be a power of two, got {c.shape[1]}")
    if c.device != like.device:
        raise ValueError(f"latent_cache: expected device {like.device}, got {c.device}")
    if c.stride(-1) != 1:
        raise ValueError("latent_cache: expected a unit stride on the last dimension")
    return c


def check_mla_shapes(
    q_nope_absorbed: object,
    q_rope: object,
    latent_cache: object,
    block_table: object,
    seq_lens: object,
    cu_seqlens_q: object | None,
) -> MlaShape:
    qn = _tensor(q_nope_absorbed, "q_nope_absorbed")
    qr = _tensor(q_rope, "q_rope")
    if qn.dim() != 3:
        raise ValueError(
            "q_nope_absorbed: expected [total_q, num_heads, kv_lora_rank], "
            f"got shape {tuple(qn.shape)}"
        )
    if qn.dtype not in FLOAT_DTYPES:
        raise ValueError(f"q_nope_absorbed: expected float32, float16 or bfloat16, got {qn.dtype}")
    if qr.dim() != 3 or qr.shape[:2] != qn.shape[:2] or qr.shape[2] < 1:
        raise ValueError(
            f"q_rope: expected [{qn.shape[0]}, {qn.shape[1]}, qk_rope_head_dim >= 1] "
            f"(tokens and heads of q_nope_absorbed), got shape {tuple(qr.shape)}"
        )
    if qn.shape[2] < 1:
        raise ValueError("q_nope_absorbed: kv_lora_rank must be >= 1")
    if qr.dtype != qn.dtype or qr.device != qn.device:
        raise ValueError(
            f"q_rope: expected dtype {qn.dtype} on {qn.device} (as q_nope_absorbed), "
            f"got {qr.dtype} on {qr.device}"
        )
    total_q, heads, rank = qn.shape
    rope = qr.shape[2]
    cache = check_latent_cache(latent_cache, rank, rope, qn)
    if cache.dtype != qn.dtype:
        raise ValueError(
            f"latent_cache: expected dtype {qn.dtype} (as q_nope_absorbed), got {cache.dtype}"
        )
    bt = _tensor(block_table, "block_table")
    if bt.dim() != 2:
        raise ValueError(f"block_table: expected [batch, max_blocks], got shape {tuple(bt.shape)}")
    batch = bt.shape[0]
    _index(bt, "block_table", tuple(bt.shape), qn.device)
    _index(seq_lens, "seq_lens", (batch,), qn.device)
    if cu_seqlens_q is None:
        if total_q != batch:
            raise ValueError(
                f"q_nope_absorbed: expected one query per sequence ({batch} rows), got {total_q}"
            )
    else:
        _index(cu_seqlens_q, "cu_seqlens_q", (batch + 1,), qn.device)
    return MlaShape(batch, total_q, heads, rank, rope, cache.shape[0], cache.shape[1], bt.shape[1])


def check_mla_values(
    shape: MlaShape,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
) -> None:
    """The paged index checks of `check_paged_values` (causal: no sequence has more queries
    than cached positions), plus: an empty batch has no query rows."""
    if shape.batch == 0 and shape.total_q:
        raise ValueError(f"cu_seqlens_q: no sequences but {shape.total_q} query rows")
    check_paged_values(shape, block_table, seq_lens, cu_seqlens_q)


def check_write_latent(
    kv_latent: object, k_rope: object, latent_cache: object, slot_mapping: object
) -> None:
    kv = _tensor(kv_latent, "kv_latent")
    kr = _tensor(k_rope, "k_rope")
    if kv.dim() != 2 or kv.shape[1] < 1:
        raise ValueError(f"kv_latent: expected [tokens, kv_lora_rank], got shape {tuple(kv.shape)}")
    if kr.dim() != 2 or kr.shape[0] != kv.shape[0] or kr.shape[1] < 1:
        raise ValueError(
            f"k_rope: expected [{kv.shape[0]}, qk_rope_head_dim], got shape {tuple(kr.shape)}"
        )
    for name, t in (("kv_latent", kv), ("k_rope", kr)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name}: expected float32, float16 or bfloat16, got {t.dtype}")
        if t.device != kv.device:
            raise ValueError(f"{name}: expected device {kv.device}, got {t.device}")
    cache = check_latent_cache(latent_cache, kv.shape[1], kr.shape[1], kv)
    if cache.dtype not in FLOAT_DTYPES:
        raise ValueError(f"latent_cache: expected a float dtype, got {cache.dtype}")
    slots = _tensor(slot_mapping, "slot_mapping")
    if slots.dtype not in (torch.int32, torch.int64) or tuple(slots.shape) != (kv.shape[0],):
        raise ValueError(
            f"slot_mapping: expected int32/int64 of shape ({kv.shape[0]},), "
            f"got {slots.dtype} {tuple(slots.shape)}"
        )
    if slots.device != kv.device:
        raise ValueError(f"slot_mapping: expected device {kv.device}, got {slots.device}")


def check_slot_values(slot_mapping: torch.Tensor, num_slots: int) -> None:
    if slot_mapping.numel() == 0:
        return
    s = slot_mapping.to(torch.int64)
    bad = (s < -1) | (s >= num_slots)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"slot_mapping: entry [{i}] = {int(s[i])} is outside [-1, {num_slots}) "
            "(-1 skips the token)"
        )
    valid = s[s >= 0]
    if valid.numel() != torch.unique(valid).numel():
        raise ValueError("slot_mapping: a slot appears more than once (the write would race)")
