"""One layer's attention in a prefill step of several short prompts (#24 "16 concurrent"): the
compiled tile kernel over all prompts in one call (``plan_paged_attention(cpu_kernel=...)``,
prefill tiles batched, causal keys only) against one SDPA per prompt (the plan without the
kernel, what a prefill tile of more than 16 queries ran before).

Same process, one thread, CPU time, the two alternated ``--repeats`` times; prints each
round's ratio (SDPA per prompt / kernel) and the median. SmolLM2-135M's heads (9 query,
3 KV, head dim 64), block size 16:

    .venv/bin/python benchmarks/prefill_attention_ab.py --prompts 16 --lens 76,77 --repeats 7
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from deepinfer_kernels import plan_paged_attention
from deepinfer_kernels.cpu import PagedAttentionTiles


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--lens", default="76,77", help="prompt lengths, cycled over the prompts")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--heads", default="9,3,64", help="query heads, KV heads, head dim")
    args = p.parse_args()
    torch.set_num_threads(1)
    hq, hkv, d = (int(x) for x in args.heads.split(","))
    bs = 16
    cycle = [int(x) for x in args.lens.split(",")]
    lens = [cycle[i % len(cycle)] for i in range(args.prompts)]
    pages = [-(-n // bs) for n in lens]
    starts = list(itertools.accumulate(pages, initial=0))
    width = max(pages)
    table = [list(range(s, s + n)) + [0] * (width - n) for s, n in zip(starts, pages)]
    bt = torch.tensor(table, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    cu = torch.tensor(list(itertools.accumulate(lens, initial=0)), dtype=torch.int32)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(starts[-1], bs, hkv, d, generator=g)
    v = torch.randn(starts[-1], bs, hkv, d, generator=g)
    q = torch.randn(int(cu[-1]), hq, d, generator=g)
    kernel = PagedAttentionTiles()
    if not kernel.available():
        print("the compiled kernel is unavailable here:", kernel.fn.error)
        return 1
    kw = {"block_size": bs, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d}
    plans = {
        "sdpa per prompt": plan_paged_attention(bt, seq_lens, cu, **kw),
        "kernel, one call": plan_paged_attention(bt, seq_lens, cu, **kw, cpu_kernel=kernel),
    }
    with torch.inference_mode():
        a, b = (plan.run(q, k, v) for plan in plans.values())
        print(f"max |difference| {float((a - b).abs().max()):.2e}")
        calls = max(2, 3000 // max(lens))
        times: dict[str, list[float]] = {name: [] for name in plans}
        for _ in range(args.repeats):
            for name, plan in plans.items():
                start = time.process_time()
                for _ in range(calls):
                    plan.run(q, k, v)
                times[name].append((time.process_time() - start) / calls)
    for name, ts in times.items():
        print(f"{name:18s} {statistics.median(ts) * 1e3:7.3f} ms a layer (median)")
    ratios = [x / y for x, y in zip(*times.values())]
    print(
        f"{args.prompts} prompts of {args.lens} tokens: sdpa per prompt / kernel "
        f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
