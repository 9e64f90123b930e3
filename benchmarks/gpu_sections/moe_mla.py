"""GPU check section: MLA decode and fused MoE (#22).

* MLA decode (``mla_decode_attention``, Triton split-K): achieved HBM bandwidth = latent bytes
  read / time, as a fraction of the H200's 4.8 TB/s (target >= 60%; FlashMLA reports about
  3,000 GB/s on H800), DeepSeek-V3 widths (rank 512 + rope 64, bf16, block 64), 16 query heads
  (TP8) and 128 (TP1), batch 64 and 128, context 4k-64k.
* Fused MoE (Triton grouped GEMMs) against the Hugging Face per-expert loop in torch at
  DeepSeek-V2-Lite sizes (hidden 2048, intermediate 1408, 64 experts, top 6, bf16).

GPU-only work happens inside ``run()``; importing this module is cheap and safe on CPU.
"""

from __future__ import annotations

import time

PEAK_BYTES_PER_S = 4.8e12
RANK, ROPE, BLOCK = 512, 64, 64
MLA_HEADS = (16, 128)
MLA_BATCHES = (64, 128)
MLA_CONTEXTS = (4096, 16384, 65536)
MOE_HIDDEN, MOE_INTER, MOE_EXPERTS, MOE_TOP_K = 2048, 1408, 64, 6
MOE_TOKENS = (1, 64, 512, 4096)
TIME_BUDGET_S = 60.0


def latent_bytes(batch: int, context: int, itemsize: int = 2) -> int:
    """Bytes of latent cache one decode step reads: every position's full row, once."""
    return batch * context * (RANK + ROPE) * itemsize


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


def _mla_row(heads: int, batch: int, context: int) -> str:
    import torch

    import deepinfer_kernels as dk

    per_seq = context // BLOCK
    cache = torch.zeros(batch * per_seq, BLOCK, RANK + ROPE, dtype=torch.bfloat16, device="cuda")
    cache.view(-1)[: 1 << 20].normal_()
    table = torch.randperm(batch * per_seq, device="cuda").view(batch, per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    qn = torch.randn(batch, heads, RANK, dtype=torch.bfloat16, device="cuda")
    qr = torch.randn(batch, heads, ROPE, dtype=torch.bfloat16, device="cuda")
    t = _bench(
        dk.mla_decode_attention, qn, qr, cache, table, lens, scale=192**-0.5, check_values=False
    )
    bw = latent_bytes(batch, context) / t
    return (
        f"| {heads} | {batch} | {context} | {latent_bytes(batch, context) / 1e9:.2f} | "
        f"{t * 1e6:.0f} | {bw / 1e12:.2f} | {100 * bw / PEAK_BYTES_PER_S:.0f}% |"
    )


def mla_table(deadline: float) -> str:
    import torch

    rows = [
        "| heads | batch | context | latent GB | us | TB/s | % of 4.8 TB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for heads in MLA_HEADS:
        for context in MLA_CONTEXTS:
            for batch in MLA_BATCHES:
                if time.perf_counter() > deadline:
                    rows.append(f"| {heads} | {batch} | {context} | skipped: time budget | | | |")
                    continue
                rows.append(_mla_row(heads, batch, context))
                torch.cuda.empty_cache()
    return "\n".join(rows)


def _per_expert_loop(hidden, w_gate_up, w_down, weights, ids):  # type: ignore[no-untyped-def]
    import torch
    import torch.nn.functional as F

    out = torch.zeros_like(hidden)
    mask = F.one_hot(ids.long(), w_gate_up.shape[0]).permute(2, 1, 0)
    for e in range(w_gate_up.shape[0]):
        slot, tok = torch.where(mask[e])
        gate, up = (hidden[tok] @ w_gate_up[e].t()).chunk(2, -1)
        y = (F.silu(gate) * up) @ w_down[e].t()
        out.index_add_(0, tok, (y * weights[tok, slot, None]).to(hidden.dtype))
    return out


def moe_table(deadline: float) -> str:
    import torch

    import deepinfer_kernels as dk

    w_gate_up = (
        torch.randn(MOE_EXPERTS, 2 * MOE_INTER, MOE_HIDDEN, dtype=torch.bfloat16, device="cuda")
        / MOE_HIDDEN**0.5
    )
    w_down = (
        torch.randn(MOE_EXPERTS, MOE_HIDDEN, MOE_INTER, dtype=torch.bfloat16, device="cuda")
        / MOE_INTER**0.5
    )
    rows = ["| tokens | fused us | per-expert loop us | loop / fused |", "|---:|---:|---:|---:|"]
    for tokens in MOE_TOKENS:
        if time.perf_counter() > deadline:
            rows.append(f"| {tokens} | skipped: time budget | | |")
            continue
        hidden = torch.randn(tokens, MOE_HIDDEN, dtype=torch.bfloat16, device="cuda")
        logits = torch.randn(tokens, MOE_EXPERTS, device="cuda")
        weights, ids = dk.moe_route(logits, MOE_TOP_K, renormalize=True, check_values=False)
        args = (hidden, w_gate_up, w_down, weights, ids)
        t_fused = _bench(dk.fused_moe, *args, check_values=False, reps=10)
        t_loop = _bench(_per_expert_loop, *args, reps=5)
        rows.append(
            f"| {tokens} | {t_fused * 1e6:.0f} | {t_loop * 1e6:.0f} | {t_loop / t_fused:.2f}x |"
        )
    return "\n".join(rows)


def run() -> str:
    import torch

    if not torch.cuda.is_available():
        return "## MLA decode and fused MoE\n\nskipped: no CUDA device\n"
    deadline = time.perf_counter() + TIME_BUDGET_S
    mla = mla_table(deadline - TIME_BUDGET_S * 0.3)
    moe = moe_table(deadline)
    return (
        "## MLA decode and fused MoE\n\n"
        f"MLA decode (rank {RANK} + rope {ROPE}, bf16, block {BLOCK}); bandwidth = latent bytes "
        "read / time; target >= 60% of 4.8 TB/s.\n\n"
        f"{mla}\n\n"
        f"Fused MoE (hidden {MOE_HIDDEN}, intermediate {MOE_INTER}, {MOE_EXPERTS} experts, "
        f"top {MOE_TOP_K}, bf16) against the per-expert torch loop.\n\n"
        f"{moe}\n"
    )
