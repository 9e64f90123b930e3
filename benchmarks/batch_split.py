"""Where the 16-concurrent run of ``vs_llamacpp.py`` spends its CPU time (#24 "16 concurrent"):
the prefill step (all prompts' rows at once, plus the first token) against the decode steps
(one row per sequence), and within a decode step the model (forward and LM head) against the
engine around it (scheduling, sampling, Python).

One thread, CPU seconds of the process, same process, ``--repeats`` rounds of: the batch with
1 new token (prefill), the batch with ``--new`` tokens, and ``--new - 1`` bare model steps of
the same rows over the same context (``model.compute_logits(model(...))``). Prints medians and
ranges:

    .venv/bin/python benchmarks/batch_split.py --new 16 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_llamacpp import CODE_PROMPT, Ours

from deepinfer.models import AttentionMetadata, KVPool, default_model_path


def _bare_steps(ours: Ours, rows: int, context: int, steps: int) -> float:
    """CPU seconds of ``steps`` model steps of ``rows`` sequences at ``context`` tokens."""
    model = ours.llm.engine.runner.model
    bs = 16
    per_seq = -(-(context + steps + 1) // bs)
    pool = KVPool.for_model(model.config, rows * per_seq, bs)
    tables = [pool.allocate(per_seq) for _ in range(rows)]
    vocab = model.config.vocab_size
    with torch.inference_mode():
        start = time.process_time()
        for s in range(steps):
            length = context + s + 1
            attn = AttentionMetadata.build(tables, [length] * rows, [1] * rows, bs)
            ids = torch.randint(0, vocab, (rows,))
            model.compute_logits(model(ids, torch.full((rows,), length - 1), attn, pool))
        return time.process_time() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new", type=int, default=16, help="new tokens a request (vs_llamacpp: 16)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    ours = Ours(default_model_path(), 1, 2048 + 4 * args.new + 64)
    batch = [ours.tokens(f"Question {i}: " + CODE_PROMPT) for i in range(args.batch)]
    context = sum(map(len, batch)) // len(batch)
    ours.generate(batch, 2, time.process_time)  # warm: kernels built, weights touched
    prefill, total, bare = [], [], []
    for _ in range(args.repeats):
        prefill.append(ours.generate(batch, 1, time.process_time))
        total.append(ours.generate(batch, args.new, time.process_time))
        bare.append(_bare_steps(ours, args.batch, context, args.new - 1))

    def show(v: list[float], unit: float = 1.0) -> str:
        return f"{statistics.median(v) * unit:.2f} ({min(v) * unit:.2f}-{max(v) * unit:.2f})"

    steps = args.new - 1
    decode = [t - f for t, f in zip(total, prefill, strict=True)]
    share = [d / t for d, t in zip(decode, total, strict=True)]
    per_step = [d / steps for d in decode]
    engine = [(d - b) / d for d, b in zip(decode, bare, strict=True)]
    rows = sum(map(len, batch))
    print(f"{args.batch} requests, {rows} prompt rows, {args.new} new tokens, 1 thread, CPU s")
    print(f"whole run: {show(total)} s; prefill step + first token: {show(prefill)} s")
    print(f"{steps} decode steps: {show(decode)} s = {show(share, 100)}% of the run")
    print(f"a decode step: {show(per_step, 1e3)} ms; bare model step: "
          f"{show([b / steps for b in bare], 1e3)} ms; engine around the model: "
          f"{show(engine, 100)}% of the decode steps")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
