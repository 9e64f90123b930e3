"""Public paged-attention ops: validation, DLPack interop and dispatch around the custom ops.

Conventions (see docs/kernels.md): ``k_cache``/``v_cache`` are
``[num_blocks, block_size, num_kv_heads, head_dim]``; ``block_table`` int32
``[batch, max_blocks]``; ``seq_lens`` int32 ``[batch]`` counts KV positions including the new
tokens; ``cu_seqlens_q`` int32 ``[batch + 1]``. The queries of sequence ``b`` are its last
``q_len`` positions. ``sliding_window=W`` lets the query at position ``p`` read keys in
``(p - W, p]``; ``soft_cap=c`` maps each scaled logit ``s`` to ``c * tanh(s / c)``; ``lse`` is
the natural-log log-sum-exp of the kept logits, in fp32.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.attention.autograd import with_reference_backward
from deepinfer_kernels.attention.merge import check_merge_inputs
from deepinfer_kernels.attention.ops import (
    merge_attention_states_impl,
    merge_attention_states_op,
    paged_attention_impl,
    paged_attention_op,
    paged_decode_attention_impl,
    paged_decode_attention_op,
)
from deepinfer_kernels.attention.splits import (
    choose_num_splits,
    compiled_split_count,
    decode_split_count,
)
from deepinfer_kernels.attention.torch_path import default_scale
from deepinfer_kernels.attention.validate import (
    check_options,
    check_paged_shapes,
    check_paged_values,
    want_value_checks,
)


def _check_bool(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value)!r}")


def paged_attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    seq_lens: Any,
    cu_seqlens_q: Any,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    return_lse: bool = False,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> Any:
    """Attention of ragged queries over a paged KV cache (decode, verify, extend, chunked prefill).

    For sequence ``b`` the ``q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]`` rows of ``q``
    (``[total_q, Hq, D]``) are its last ``q_len`` of ``seq_lens[b]`` positions, already in the
    cache. Query head ``h`` reads KV head ``h // (Hq // Hkv)``. With ``s_j = scale * q.k_j``
    (soft-capped if asked) over the kept keys ``j`` (``j < seq_len``, ``j <= p`` if causal,
    ``j > p - W`` with a window), ``o = sum_j softmax(s)_j v_j``, accumulated in fp32.

    Returns ``o`` shaped like ``q`` (and ``lse [total_q, Hq]`` fp32 when ``return_lse``).
    Accepts DLPack arrays and answers in the caller's array kind. ``check_values=False``
    skips the data-dependent checks (they cost a host sync on CUDA).
    """
    convert = result_converter(q, k_cache, v_cache)
    q, k_cache, v_cache = (
        to_torch(q, "q"),
        to_torch(k_cache, "k_cache"),
        to_torch(v_cache, "v_cache"),
    )
    block_table = to_torch(block_table, "block_table")
    seq_lens = to_torch(seq_lens, "seq_lens")
    cu_seqlens_q = to_torch(cu_seqlens_q, "cu_seqlens_q")
    shape = check_paged_shapes(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q)
    scale, window, cap = check_options(scale, sliding_window, soft_cap)
    _check_bool(causal, "causal")
    if want_value_checks(check_values):
        check_paged_values(shape, block_table, seq_lens, cu_seqlens_q, causal=causal)
    triton = should_use_triton(q.device, use_triton)
    s = default_scale(shape.head_dim, scale)
    op = eager_or_op(paged_attention_op, paged_attention_impl)
    args = (q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q)
    if torch.compiler.is_compiling():
        out, lse = op(*args, s, causal, window, cap, triton)  # the op carries its backward
    else:
        out, lse = with_reference_backward(
            lambda: op(*args, s, causal, window, cap, triton),
            *args, scale=s, causal=causal, window=window, soft_cap=cap,
        )  # fmt: skip
    return (convert(out), convert(lse)) if return_lse else convert(out)


def paged_decode_attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    num_splits: int | None = None,
    return_lse: bool = False,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> Any:
    """Decode attention (one query per sequence, ``q`` is ``[batch, Hq, D]``), split-K.

    The Triton path splits each sequence's keys into ``num_splits`` chunks attended in
    parallel and merges them by log-sum-exp (flash-decoding). ``None`` picks the count from
    the batch size and the longest real ``seq_lens`` when value checks run (they read the
    lengths anyway), else from the block table's capacity (no host sync), rounded down to a
    compiled count (``deepinfer_kernels.launch_configs.SPLIT_COUNTS``); an explicit count is
    used as given. The torch path computes the same result without splitting. Same semantics
    and options as :func:`paged_attention` with causal masking.
    """
    convert = result_converter(q, k_cache, v_cache)
    q, k_cache, v_cache = (
        to_torch(q, "q"),
        to_torch(k_cache, "k_cache"),
        to_torch(v_cache, "v_cache"),
    )
    block_table = to_torch(block_table, "block_table")
    seq_lens = to_torch(seq_lens, "seq_lens")
    shape = check_paged_shapes(q, k_cache, v_cache, block_table, seq_lens, None)
    scale, window, cap = check_options(scale, sliding_window, soft_cap)
    if num_splits is not None and (
        isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1
    ):
        raise ValueError(f"num_splits: expected an int >= 1 or None, got {num_splits!r}")
    checked = want_value_checks(check_values)
    if checked:
        check_paged_values(shape, block_table, seq_lens, None)
    if num_splits is None and checked:
        lens = seq_lens.tolist()
        num_splits = decode_split_count([1] * len(lens), lens, shape.num_kv_heads, window)
    elif num_splits is None:
        span = shape.max_blocks * shape.block_size
        if window > 0:
            span = min(span, window)
        num_splits = compiled_split_count(choose_num_splits(shape.batch, shape.num_kv_heads, span))
    triton = should_use_triton(q.device, use_triton)
    s = default_scale(shape.head_dim, scale)
    op = eager_or_op(paged_decode_attention_op, paged_decode_attention_impl)
    args = (q, k_cache, v_cache, block_table, seq_lens)
    if torch.compiler.is_compiling():
        out, lse = op(*args, s, window, cap, num_splits, triton)
    else:
        cu = torch.arange(shape.batch + 1, dtype=torch.int32, device=q.device)
        out, lse = with_reference_backward(
            lambda: op(*args, s, window, cap, num_splits, triton),
            *args, cu, scale=s, causal=True, window=window, soft_cap=cap,
        )  # fmt: skip
    return (convert(out), convert(lse)) if return_lse else convert(out)


def merge_attention_states(
    o_a: Any, lse_a: Any, o_b: Any, lse_b: Any, *, use_triton: bool | None = None
) -> Any:
    """Merge attention over two disjoint key sets into attention over their union.

    ``o_* [T, H, D]``, ``lse_* [T, H]`` fp32 (natural log, ``-inf`` = no keys). Returns
    ``(o, lse)`` with ``lse = logaddexp(lse_a, lse_b)`` and
    ``o = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b``.
    """
    convert = result_converter(o_a, lse_a, o_b, lse_b)
    o_a, lse_a = to_torch(o_a, "o_a"), to_torch(lse_a, "lse_a")
    o_b, lse_b = to_torch(o_b, "o_b"), to_torch(lse_b, "lse_b")
    check_merge_inputs(o_a, lse_a, o_b, lse_b)
    triton = should_use_triton(o_a.device, use_triton)
    out, lse = eager_or_op(merge_attention_states_op, merge_attention_states_impl)(
        o_a, lse_a, o_b, lse_b, triton
    )
    return convert(out), convert(lse)
