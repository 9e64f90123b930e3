"""How many key splits a decode launch uses (flash-decoding), from sizes or real lengths.

A decode batch gives the unified kernel one program per (sequence, KV head): a batch-1 decode
with 8 KV heads runs 8 programs on a 132-SM GPU and reads its whole context through them.
Cutting each sequence's keys into ``S`` chunks attended in parallel (merged by log-sum-exp)
multiplies the programs by ``S``, as vLLM's unified attention does with its 3D launch for
decode. ``NUM_SPLITS`` is a compile-time constant, so counts are rounded down to the small
compiled set :data:`~deepinfer_kernels.launch_configs.SPLIT_COUNTS`.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepinfer_kernels.launch_configs import SPLIT_COUNTS

# Enough programs to fill an H200-class GPU (132 SMs) about twice over.
TARGET_PROGRAMS = 264
# Fewer keys than this per split costs more in the merge than the split gains.
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 64


def choose_num_splits(batch: int, num_kv_heads: int, max_kv_len: int) -> int:
    """Split-K factor for decode from sizes only (no host sync).

    Enough splits that ``batch * num_kv_heads * splits`` programs fill the GPU, but never
    fewer than ``256`` keys per split, and at most 64 splits.
    """
    want = -(-TARGET_PROGRAMS // max(1, batch * num_kv_heads))
    by_len = max(1, max_kv_len // MIN_KEYS_PER_SPLIT)
    return max(1, min(want, by_len, MAX_SPLITS))


def compiled_split_count(num_splits: int) -> int:
    """The largest compiled split count not above ``num_splits`` (at least 1)."""
    return max([s for s in SPLIT_COUNTS if s <= num_splits], default=1)


def decode_split_count(
    query_lens: Sequence[int], kv_lens: Sequence[int], num_kv_heads: int, window: int
) -> int:
    """Splits for one batch from its real lengths: 1 (the unified kernel) unless every
    sequence has exactly one query (a decode batch) and too few programs would fill the GPU;
    then :func:`choose_num_splits` over the longest key span actually read (the window caps
    it), rounded down to a compiled count."""
    if not query_lens or any(n != 1 for n in query_lens):
        return 1
    span = max(kv_lens)
    if window > 0:
        span = min(span, window)
    return compiled_split_count(choose_num_splits(len(query_lens), num_kv_heads, span))


__all__ = [
    "choose_num_splits",
    "compiled_split_count",
    "decode_split_count",
]
