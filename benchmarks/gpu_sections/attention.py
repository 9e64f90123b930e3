"""GPU check section: paged attention.

* Decode (split-K ``paged_decode_attention``, the unified ``paged_attention`` with one
  query per sequence, and ``plan_paged_attention(...).run`` as the engine calls it, with the
  launch the plan picks from the real lengths): achieved HBM bandwidth = KV bytes read / time, as a fraction of the
  H200's 4.8 TB/s, for batch 1-128 and context 1k-128k (Llama-3-8B-like heads: 32 query
  heads, 8 KV heads, head_dim 128, bf16, block 16, shuffled pages).
* Extend (prefill over a cached prefix): TFLOP/s of ``paged_attention`` against
  ``scaled_dot_product_attention`` with the flash backend at equal shapes (dense K/V,
  bottom-right causal mask).

GPU-only work happens inside ``run()``; importing this module is cheap and safe on CPU.
"""

from __future__ import annotations

import math
import time

PEAK_BYTES_PER_S = 4.8e12
HQ, HKV, D, BLOCK = 32, 8, 128, 16
DECODE_BATCHES = (1, 8, 32, 128)
DECODE_CONTEXTS = (1024, 8192, 32768, 131072)
MAX_KV_BYTES = 72e9  # leave room on a 141 GB card
EXTEND_SHAPES = ((1, 0, 4096), (1, 0, 16384), (4, 0, 4096), (1, 8192, 2048), (4, 28672, 512))
TIME_BUDGET_S = 150.0


def _bench(fn, *args, reps: int = 20, **kwargs) -> float:  # type: ignore[no-untyped-def]
    """Median seconds per ``fn(*args, **kwargs)`` with CUDA events (after warm-up)."""
    import torch

    fn(*args, **kwargs)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args, **kwargs)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def _paged_pool(batch: int, context: int, dtype):  # type: ignore[no-untyped-def]
    import torch

    per_seq = math.ceil(context / BLOCK)
    num_blocks = batch * per_seq
    k = torch.zeros(num_blocks, BLOCK, HKV, D, dtype=dtype, device="cuda")
    v = torch.zeros_like(k)
    k.view(-1)[: 1 << 20].normal_()
    v.view(-1)[: 1 << 20].normal_()
    table = torch.randperm(num_blocks, device="cuda").view(batch, per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return k, v, table, seq_lens


def _decode_row(batch: int, context: int) -> str:
    import torch

    import deepinfer_kernels as dk

    kv_bytes = 2 * batch * context * HKV * D * 2
    k, v, table, seq_lens = _paged_pool(batch, context, torch.bfloat16)
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device="cuda")
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    args = (q, k, v, table, seq_lens)
    t_split = _bench(dk.paged_decode_attention, *args, check_values=False)
    t_unified = _bench(dk.paged_attention, *args, cu, check_values=False)
    # What the engine runs: one plan per step (it reads the real lengths), plan.run per layer.
    plan = dk.plan_paged_attention(
        table, seq_lens, cu, block_size=BLOCK, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D
    )
    t_plan = _bench(plan.run, q, k, v)
    launch = f"split-K x{plan.decode_splits}" if plan.decode_splits > 1 else "unified"
    bw = kv_bytes / t_split
    return (
        f"| {batch} | {context} | {kv_bytes / 1e9:.2f} | {t_split * 1e6:.0f} | "
        f"{bw / 1e12:.2f} | {100 * bw / PEAK_BYTES_PER_S:.0f}% | {t_unified * 1e6:.0f} | "
        f"{100 * kv_bytes / t_unified / PEAK_BYTES_PER_S:.0f}% | {launch} | {t_plan * 1e6:.0f} | "
        f"{100 * kv_bytes / t_plan / PEAK_BYTES_PER_S:.0f}% |"
    )


def decode_table(deadline: float) -> str:
    import torch

    rows = [
        "| batch | context | KV GB | split-K us | split-K TB/s | % of 4.8 TB/s "
        "| unified us | unified % | plan picks | plan us | plan % |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for context in DECODE_CONTEXTS:
        for batch in DECODE_BATCHES:
            if 2 * batch * context * HKV * D * 2 > MAX_KV_BYTES:
                continue
            if time.perf_counter() > deadline:
                rows.append(f"| {batch} | {context} | skipped: time budget | | | | | | | | |")
                continue
            rows.append(_decode_row(batch, context))
            torch.cuda.empty_cache()
    return "\n".join(rows)


def _causal_flops(batch: int, prefix: int, new: int) -> float:
    # Two matmuls of 2*D flops per (query, visible key) pair; query i sees prefix + i + 1 keys.
    pairs = new * prefix + new * (new + 1) / 2
    return 4.0 * batch * HQ * D * pairs


def _extend_row(batch: int, prefix: int, new: int) -> str:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    import deepinfer_kernels as dk

    total = prefix + new
    k, v, table, seq_lens = _paged_pool(batch, total, torch.bfloat16)
    k.normal_()
    v.normal_()
    q = torch.randn(batch * new, HQ, D, dtype=torch.bfloat16, device="cuda")
    cu = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device="cuda")
    t_ours = _bench(dk.paged_attention, q, k, v, table, seq_lens, cu, check_values=False, reps=10)
    # Dense K/V of the same sequences for SDPA, KV heads expanded outside the timing.
    kd = k[table.long()].reshape(batch, -1, HKV, D)[:, :total].transpose(1, 2)
    vd = v[table.long()].reshape(batch, -1, HKV, D)[:, :total].transpose(1, 2)
    kd = kd.repeat_interleave(HQ // HKV, 1).contiguous()
    vd = vd.repeat_interleave(HQ // HKV, 1).contiguous()
    qd = q.view(batch, new, HQ, D).transpose(1, 2).contiguous()
    flops = _causal_flops(batch, prefix, new)
    try:
        mask = causal_lower_right(new, total)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            t_sdpa = _bench(F.scaled_dot_product_attention, qd, kd, vd, attn_mask=mask, reps=10)
        sdpa, ratio = f"{flops / t_sdpa / 1e12:.0f}", f"{t_sdpa / t_ours:.2f}x"
    except RuntimeError as exc:
        sdpa, ratio = f"n/a ({str(exc).splitlines()[0][:60]})", "n/a"
    return f"| {batch} | {prefix} | {new} | {flops / t_ours / 1e12:.0f} | {sdpa} | {ratio} |"


def extend_table(deadline: float) -> str:
    import torch

    rows = [
        "| batch | cached prefix | new tokens | ours TFLOP/s | SDPA flash TFLOP/s | ours / SDPA |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for batch, prefix, new in EXTEND_SHAPES:
        if time.perf_counter() > deadline:
            rows.append(f"| {batch} | {prefix} | {new} | skipped: time budget | | |")
            continue
        rows.append(_extend_row(batch, prefix, new))
        torch.cuda.empty_cache()
    return "\n".join(rows)


def run() -> str:
    import torch

    if not torch.cuda.is_available():
        return "## Paged attention\n\nskipped: no CUDA device\n"
    deadline = time.perf_counter() + TIME_BUDGET_S
    decode = decode_table(deadline - TIME_BUDGET_S * 0.4)
    extend = extend_table(deadline)
    return (
        "## Paged attention\n\n"
        f"Decode (Hq={HQ}, Hkv={HKV}, D={D}, bf16, block {BLOCK}); bandwidth = K+V bytes read "
        "/ time; targets: >= 80% of 4.8 TB/s at long context.\n\n"
        f"{decode}\n\n"
        "Extend (same heads, bf16); SDPA runs on dense K/V with a bottom-right causal mask; "
        "target: ours / SDPA >= 0.9.\n\n"
        f"{extend}\n"
    )
