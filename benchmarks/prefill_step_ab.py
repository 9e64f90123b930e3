"""One prefill step of several prompts at once (the 16-concurrent run's first step: 16 prompts of
76-77 tokens in one forward, then the LM head on each prompt's last row) with the current
``deepinfer`` and ``deepinfer_kernels`` against both packages as of an earlier commit, in
alternating child processes:

    .venv/bin/python benchmarks/prefill_step_ab.py --baseline REV [--prompts 16] [--rounds 4]

The baseline side runs ``git archive REV`` of both packages (Python and C) from a temporary
directory put first on ``PYTHONPATH``. A child loads the embedded GGUF model on one thread and
times ``--repeats`` prefill steps (after one warm-up step) in CPU seconds of the calling thread.
Prints each side's step times per round and the baseline/current time ratio of each round's
best (median, range).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"deepinfer_kernels/src/deepinfer_kernels": "kernels", "deepinfer": "root"}


def _child(prompts: int, repeats: int) -> int:
    import torch

    from deepinfer.models import AttentionMetadata, KVPool, default_model_path, load_model

    torch.set_num_threads(1)
    model = load_model(default_model_path()).model
    bs = 16
    lens = [76 + (i % 3 == 0) for i in range(prompts)]
    per_seq = -(-max(lens) // bs)
    pool = KVPool.for_model(model.config, prompts * per_seq, bs)
    tables = [pool.allocate(per_seq) for _ in range(prompts)]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (sum(lens),), generator=gen)
    pos = torch.cat([torch.arange(n) for n in lens])
    last = torch.tensor(lens).cumsum(0) - 1
    times: list[float] = []
    with torch.inference_mode():
        for r in range(repeats + 1):  # the first one warms (builds, first touch)
            attn = AttentionMetadata.build(tables, lens, lens, bs)
            start = time.thread_time()
            model.compute_logits(model(ids, pos, attn, pool)[last])
            if r:
                times.append(time.thread_time() - start)
    print(json.dumps({"s": times}))
    return 0


def _baseline_tree(rev: str, into: Path) -> str:
    """Both packages as of ``rev`` under ``into``; returns the PYTHONPATH entries."""
    paths = []
    for package, name in PACKAGES.items():
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, package], check=True, capture_output=True
        ).stdout
        target = into / name
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
        paths.append(str(target / Path(package).parent))
    return os.pathsep.join(paths)


def _run_side(pythonpath: str | None, args: argparse.Namespace) -> list[float]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", "--prompts", str(args.prompts)]
    cmd += ["--repeats", str(args.repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"child ({pythonpath or 'current'}) failed:\n{done.stderr[-4000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1])["s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision to compare with")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.prompts, args.repeats)
    if not args.baseline:
        parser.error("--baseline: required (a git revision, e.g. HEAD~3)")
    best: dict[str, list[float]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="prefill-step-ab-") as tmp:
        sides: dict[str, str | None] = {
            "baseline": _baseline_tree(args.baseline, Path(tmp)),
            "current": None,
        }
        for r in range(args.rounds):
            for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
                s = _run_side(sides[name], args)
                best[name].append(min(s))
                print(f"round {r} {name:8s} s/step (CPU): " + ", ".join(f"{v:.3f}" for v in s))
    ratios = [b / c for c, b in zip(best["current"], best["baseline"], strict=True)]
    print(
        f"{args.prompts}-prompt prefill step, baseline ({args.baseline}) / current time, best "
        f"per round: {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
