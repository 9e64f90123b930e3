"""CPU speed of the model runner on the embedded SmolLM2-135M: fp32 vs bf16, prefill and decode.

Usage: python benchmarks/model_runner_cpu.py [--threads N] [--prompt-len 256] [--decode 32]

Prints prefill tokens/s and batch-1 / batch-8 decode steps/s for each dtype, all measured in the
same process (ratios, not absolute numbers, are what carries across machines).
"""

from __future__ import annotations

import argparse
import time

import torch

from deepinfer.models import AttentionMetadata, KVPool, load_model


def _run(model, pool, prompt_len: int, decode: int, batch: int) -> tuple[float, float]:
    cfg = model.config
    bs = pool.block_size
    gen = torch.Generator().manual_seed(0)
    per_seq = -(-(prompt_len + decode) // bs)
    tables = [pool.allocate(per_seq) for _ in range(batch)]
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=gen)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for b in range(batch):
            attn = AttentionMetadata.build([tables[b]], [prompt_len], [prompt_len], bs)
            model(ids[b], attn.positions(), attn, pool)
        prefill = batch * prompt_len / (time.perf_counter() - t0)
        nxt = ids[:, -1]
        t0 = time.perf_counter()
        for step in range(decode):
            n = prompt_len + step + 1
            attn = AttentionMetadata.build(tables, [n] * batch, [1] * batch, bs)
            hidden = model(nxt, attn.positions(), attn, pool)
            nxt = model.compute_logits(hidden).argmax(-1)
        steps = decode / (time.perf_counter() - t0)
    for t in tables:
        pool.free(t)
    return prefill, steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--decode", type=int, default=32)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for dtype in (torch.float32, torch.bfloat16):
        loaded = load_model(dtype=dtype)
        pool = KVPool.for_model(loaded.config, num_blocks=512, block_size=16, dtype=dtype)
        _run(loaded.model, pool, 16, 2, 1)  # warm-up
        for batch in (1, 8):
            prefill, steps = _run(loaded.model, pool, args.prompt_len, args.decode, batch)
            print(
                f"{dtype!s:15s} batch {batch}: prefill {prefill:8.0f} tok/s, "
                f"decode {steps:6.1f} steps/s ({steps * batch:7.1f} tok/s)"
            )


if __name__ == "__main__":
    main()
