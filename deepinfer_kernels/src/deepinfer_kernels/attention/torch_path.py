"""Fast torch path of paged attention for CPU (and any non-Triton device).

Same maths as :mod:`deepinfer_kernels.reference.attention`, organised for speed and split in
two halves (FlashInfer-style *plan* / *run*):

* :func:`plan_tile_batches` does everything that depends only on the batch metadata (block
  table, lengths, query offsets) and not on the layer: it cuts the work into *tiles* (a
  sequence's queries, or a chunk of a long prefill), pads the short tiles (decode,
  verification) to a common query length so they run as one batch, gathers the page ids each
  tile reads (window start to causal end), and builds the additive ``0 / -inf`` mask. A model
  plans once per forward and reuses the result in every layer.
* :func:`run_tile_batches` does the per-layer work: one ``index_select`` of the pages per
  batch, the attention itself and the write-back of the valid rows.

GQA is handled by viewing the query heads as ``[Hkv, group]`` so each KV head is read once for
its whole group (no ``repeat_interleave`` of K and V). Softmax is unnormalised:
``o = (exp(s - m) @ v) / l`` and ``lse = m + log(l)``, so the log-sum-exp comes for free.

One concept per module: ``tile_plan.py`` is the plan half, ``tile_run.py`` the run half,
``cpu_flash.py`` the CPU flash kernel both consult; this module runs them in turn.
"""

from __future__ import annotations

import math

import torch

from deepinfer_kernels.attention.invalid_blocks import (
    has_unreadable_blocks,
    paged_attention_masked,
)
from deepinfer_kernels.attention.tile_plan import TileBatch, plan_tile_batches
from deepinfer_kernels.attention.tile_run import run_tile_batches

__all__ = [
    "TileBatch",
    "default_scale",
    "paged_attention_torch",
    "plan_tile_batches",
    "run_tile_batches",
]


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    window: int,
    soft_cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged attention for validated inputs (plan then run); ``window <= 0`` /
    ``soft_cap <= 0`` mean off. Returns ``(out like q, lse [total_q, Hq] fp32)``."""
    lens, cu = seq_lens.tolist(), cu_seqlens_q.tolist()
    num_blocks, block_size = k_cache.shape[:2]
    if has_unreadable_blocks(block_table, lens, num_blocks, block_size):
        # Only reachable with check_values=False: skip those keys as the Triton kernels do.
        return paged_attention_masked(
            q, k_cache, v_cache, block_table, lens, cu, scale, causal, window, soft_cap
        )
    batches = plan_tile_batches(
        block_table,
        lens,
        cu,
        block_size=k_cache.shape[1],
        num_q_heads=q.shape[1],
        num_kv_heads=k_cache.shape[2],
        causal=causal,
        window=window,
        soft_cap=soft_cap,
    )
    out, lse = run_tile_batches(batches, q, k_cache, v_cache, scale, soft_cap, want_lse=True)
    assert lse is not None
    return out, lse


def default_scale(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else scale
