"""What a model step of T = 1, 2, 3, 4 tokens of one sequence costs against a 1-token step.

A DSpark verify of k drafts is a target step of 1 + k tokens of one sequence. At batch 1 the
weights' decode is the work and it is shared by every row, so a 2-4 row step should cost little
more than a 1-row one (targets of #24: 2 rows <= 1.10x, 4 rows <= 1.3x). Each step (forward and
the LM head) is timed in CPU seconds of the calling thread with one torch thread, the row counts
alternated over ``--repeats`` rounds; medians with the round-to-round range of the ratio.

    .venv/bin/python benchmarks/few_row_step.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from deepinfer import LLM, EngineConfig
from deepinfer.models import load_model
from deepinfer.models.attention_metadata import AttentionMetadata


def cpu_ms(fn: Callable[[], object], calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return 1e3 * (time.thread_time() - start) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=8, help="steps per row count per round")
    p.add_argument("--context", type=int, default=128, help="history (tokens) attended to")
    p.add_argument("--rows", default="1,2,3,4")
    args = p.parse_args()
    torch.set_num_threads(1)
    loaded = load_model()
    model = loaded.model
    llm = LLM(
        loaded,
        engine_config=EngineConfig(num_blocks=64, max_num_seqs=4),
        enable_prefix_caching=False,
    )
    pool = llm.engine.pool
    rows = [int(r) for r in args.rows.split(",")]
    ctx, bs = args.context, pool.block_size
    blocks = pool.allocate(-(-(ctx + max(rows)) // bs))
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size

    def step(length: int) -> Callable[[], object]:
        attn = AttentionMetadata.build([blocks], [ctx + length], [length], bs)
        ids = torch.randint(0, vocab, (length,), generator=gen)
        pos = torch.arange(ctx, ctx + length)

        def run() -> object:
            return model.compute_logits(model(ids, pos, attn, pool))

        return run

    with torch.inference_mode():
        attn = AttentionMetadata.build([blocks], [ctx], [ctx], bs)
        model(torch.randint(0, vocab, (ctx,), generator=gen), torch.arange(ctx), attn, pool)
        fns = {t: step(t) for t in rows}
        for fn in fns.values():
            fn()
        times: dict[int, list[float]] = {t: [] for t in rows}
        for _ in range(args.repeats):
            for t, fn in fns.items():
                times[t].append(cpu_ms(fn, args.calls))
    pool.free(blocks)
    base = times[rows[0]]
    print(f"{args.repeats} rounds x {args.calls} steps, context {ctx}, 1 thread, CPU ms")
    for t in rows:
        ratios = [a / b for a, b in zip(times[t], base)]
        print(
            f"T={t}: {statistics.median(times[t]):6.2f} ms CPU "
            f"({min(times[t]):.2f}-{max(times[t]):.2f}); "
            f"{statistics.median(ratios):.3f}x T={rows[0]} ({min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
