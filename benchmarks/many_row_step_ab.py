"""One decode step of ``--rows`` concurrent sequences (the 16-concurrent run's decode steps) with
the current C kernels against those of an earlier commit, in alternating child processes:

    .venv/bin/python benchmarks/many_row_step_ab.py --baseline REV [--rows 16] [--rounds 4]

Same scheme as ``gguf_decode_ab.py`` (whose ``_baseline_tree`` it uses): the baseline side is the
current ``deepinfer_kernels`` package with every ``*.c``/``*.h`` taken from ``REV``, so only the
compiled kernels differ. A child loads the embedded GGUF model (Q4_1 layers, Q8_0 LM head) on
one thread, gives each of ``--rows`` sequences ``--context`` tokens of history, then times
``--repeats`` x ``--calls`` steps of one new token per sequence (the model's forward and its
LM head), in CPU seconds of the calling thread. Prints each side's median step time per round
and the current/baseline speed ratio of each round's best (median, range).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_decode_ab import _baseline_tree


def _child(rows: int, context: int, calls: int, repeats: int) -> int:
    import torch

    from deepinfer.models import AttentionMetadata, KVPool, default_model_path, load_model

    torch.set_num_threads(1)
    model = load_model(default_model_path()).model
    bs = 16
    per_seq = -(-(context + calls * (repeats + 1) + 1) // bs)
    pool = KVPool.for_model(model.config, rows * per_seq, bs)
    tables = [pool.allocate(per_seq) for _ in range(rows)]
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    steps: list[float] = []
    with torch.inference_mode():
        for table in tables:  # history: one prefill per sequence
            attn = AttentionMetadata.build([table], [context], [context], bs)
            ids = torch.randint(0, vocab, (context,), generator=gen)
            model(ids, torch.arange(context), attn, pool)
        length = context
        for r in range(repeats + 1):  # the first round warms (builds, first touch)
            start = time.thread_time()
            for _ in range(calls):
                length += 1
                attn = AttentionMetadata.build(tables, [length] * rows, [1] * rows, bs)
                ids = torch.randint(0, vocab, (rows,), generator=gen)
                pos = torch.full((rows,), length - 1)
                model.compute_logits(model(ids, pos, attn, pool))
            if r:
                steps.append(1e3 * (time.thread_time() - start) / calls)
    print(json.dumps({"ms": steps}))
    return 0


def _run_side(pythonpath: str | None, args: argparse.Namespace) -> list[float]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", "--rows", str(args.rows)]
    cmd += ["--context", str(args.context), "--calls", str(args.calls)]
    cmd += ["--repeats", str(args.repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"child ({pythonpath or 'current'}) failed:\n{done.stderr[-4000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1])["ms"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision whose C kernel sources to compare with")
    parser.add_argument("--rows", type=int, default=16, help="concurrent sequences (rows a step)")
    parser.add_argument("--context", type=int, default=80, help="history tokens per sequence")
    parser.add_argument("--calls", type=int, default=5, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.rows, args.context, args.calls, args.repeats)
    if not args.baseline:
        parser.error("--baseline: required (a git revision, e.g. HEAD~3)")
    best: dict[str, list[float]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="many-row-step-ab-") as tmp:
        sides: dict[str, str | None] = {
            "baseline": str(_baseline_tree(args.baseline, Path(tmp))),
            "current": None,
        }
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                ms = _run_side(sides[name], args)
                best[name].append(min(ms))
                print(f"round {r} {name:8s} ms/step (CPU): " + ", ".join(f"{v:.1f}" for v in ms))
    ratios = [b / c for c, b in zip(best["current"], best["baseline"], strict=True)]
    print(
        f"{args.rows}-row step, current / baseline ({args.baseline}) speed, best step per round: "
        f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
