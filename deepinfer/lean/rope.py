"""Rotary tables for the lean runtime, in the engine's layout (``deepinfer.models.rope``).

The kernel takes full-width tables per row: ``cos = [cos a, cos a]`` and ``sin = [-sin a,
sin a]`` with ``a = position * inv_freq``, ``inv_freq[i] = theta^(-2i/D)`` (Hugging Face's
half-split rotation). The engine computes them with torch in fp32; here the frequencies and
angles are the same fp32 numbers and cos/sin are correctly rounded, so a table differs from the
engine's by at most an ulp of torch's own rounding (the logits by far less than the 1e-4 the
lean runtime promises).
"""

from __future__ import annotations

import numpy as np


class Rope:
    """The tables of one model (``head_dim``, ``theta``; no scaling).

    Example::

        cos, sin = Rope(64, 10000.0).tables(np.arange(5))  # [5, 64] fp32 each
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim: expected an even int >= 2, got {head_dim}")
        if not theta > 0:
            raise ValueError(f"theta: expected a positive base, got {theta}")
        # fp32 exponents, the power rounded to fp32, an fp32 reciprocal: the engine's
        # frequencies bit for bit on the usual bases (an ulp apart on a few odd ones).
        exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
        power = (np.float64(np.float32(theta)) ** exponents.astype(np.float64)).astype(np.float32)
        self.inv_freq = np.float32(1.0) / power

    def tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)`` fp32 ``[len(positions), head_dim]`` (C-contiguous)."""
        pos = np.asarray(positions)
        if pos.ndim != 1 or pos.dtype.kind not in "iu" or (pos.size and pos.min() < 0):
            raise ValueError("positions: expected a 1-d array of ints >= 0")
        # The angle is the fp32 product (as the engine's); cos and sin of it are correctly
        # rounded (evaluated in float64).
        angles = (pos.astype(np.float32)[:, None] * self.inv_freq[None, :]).astype(np.float64)
        cos, sin = np.cos(angles), np.sin(angles)
        full_cos = np.concatenate([cos, cos], axis=1).astype(np.float32)
        signed_sin = np.concatenate([-sin, sin], axis=1).astype(np.float32)
        return full_cos, signed_sin


def rotate_and_write_kv(
    qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, slots: np.ndarray,
    k_cache: np.ndarray, v_cache: np.ndarray, num_heads: int, num_kv_heads: int,
) -> None:  # fmt: skip
    """In place, as the C layer kernels' ``rope_and_write_kv``: rotate the Q and K heads of
    each row of ``qkv`` ``[T, (Hq + 2 Hkv) D]`` by its ``cos``/``sin`` row (full-width
    tables), then write its K and V to the caches (``[blocks, block_size, Hkv, D]``) at
    ``slots`` (int ``[T]``). For the prefill's many-row path, whose products run on the sgemm
    and not in the fused layer calls."""
    t, d = qkv.shape[0], cos.shape[1]
    rotated = (num_heads + num_kv_heads) * d
    heads = qkv[:, :rotated].reshape(t, num_heads + num_kv_heads, d)  # may be a copy
    half = d // 2
    swapped = np.concatenate([heads[..., half:], heads[..., :half]], axis=-1)
    qkv[:, :rotated] = (heads * cos[:, None, :] + swapped * sin[:, None, :]).reshape(t, rotated)
    q_width, kv = num_heads * d, num_kv_heads * d  # row: Q heads, K heads, V heads
    k_rows = k_cache.reshape(-1, num_kv_heads, d)
    v_rows = v_cache.reshape(-1, num_kv_heads, d)
    k_rows[slots] = qkv[:, q_width:rotated].reshape(t, num_kv_heads, d)
    v_rows[slots] = qkv[:, rotated : rotated + kv].reshape(t, num_kv_heads, d)
