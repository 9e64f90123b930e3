"""Batch-1 greedy decode of the embedded GGUF model with the current C kernels against those of an
earlier commit, in alternating child processes (a same-run ratio on a loaded machine):

    .venv/bin/python benchmarks/gguf_decode_ab.py --baseline REV [--tokens 32] [--repeats 3]
        [--rounds 3] [--threads 2] [--cpu-time]

The baseline is the current ``deepinfer_kernels`` Python package with the C sources (every
``*.c`` and ``*.h`` under it) taken from ``REV`` (``git archive``), so only the compiled kernels
differ; the kernels' build cache keys on the sources, so both builds live side by side. Each
round runs one child per side, in alternating order; a child loads the model, decodes a few warm
tokens (the build, the first touch of the weights), then times ``--repeats`` decodes of
``--tokens`` tokens. Prints tokens/s per side and the current/baseline ratio of each round's best
decodes (median, range).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS_SRC = Path("deepinfer_kernels/src")


def _child(tokens: int, repeats: int, threads: int, cpu_time: bool) -> int:
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "deepinfer"))
    from model_helpers import greedy_paged

    from deepinfer.models import default_model_path, load_model

    torch.set_num_threads(threads)
    clock = time.thread_time if cpu_time else time.perf_counter
    loaded = load_model(default_model_path())
    prompt = loaded.tokenizer.encode("def reverse(s):\n    ")
    greedy_paged(loaded.model, prompt, 4)  # warm: kernels built, weights touched
    rates = []
    for _ in range(repeats):
        start = clock()
        greedy_paged(loaded.model, prompt, tokens)
        rates.append(tokens / (clock() - start))
    print(json.dumps({"rates": rates}))
    return 0


def _baseline_tree(rev: str, into: Path) -> Path:
    """A copy of the current kernels package with the C sources of ``rev``."""
    src = into / "src"
    shutil.copytree(ROOT / KERNELS_SRC, src, ignore=shutil.ignore_patterns("__pycache__"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, str(KERNELS_SRC)],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith((".c", ".h")):
                data = tar.extractfile(member)
                assert data is not None
                target = src / Path(member.name).relative_to(KERNELS_SRC)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data.read())
    return src


def _run_side(pythonpath: str | None, args: argparse.Namespace) -> list[float]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", "--tokens", str(args.tokens)]
    cmd += ["--repeats", str(args.repeats), "--threads", str(args.threads)]
    cmd += ["--cpu-time"] if args.cpu_time else []
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"child ({pythonpath or 'current'}) failed:\n{done.stderr[-4000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1])["rates"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision whose C kernel sources to compare with")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="rate per CPU second of the calling thread (needs --threads 1)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time: needs --threads 1 (it counts the calling thread only)")
    if args.child:
        return _child(args.tokens, args.repeats, args.threads, args.cpu_time)
    if not args.baseline:
        parser.error("--baseline: required (a git revision, e.g. HEAD~3)")
    unit = "tok/CPU-s" if args.cpu_time else "tok/s"
    with tempfile.TemporaryDirectory(prefix="gguf-decode-ab-") as tmp:
        base_src = str(_baseline_tree(args.baseline, Path(tmp)))
        sides: dict[str, str | None] = {"baseline": base_src, "current": None}
        best: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                rates = _run_side(sides[name], args)
                best[name].append(max(rates))
                print(f"round {r} {name:8s} {unit}: " + ", ".join(f"{v:.1f}" for v in rates))
    ratios = [c / b for c, b in zip(best["current"], best["baseline"], strict=True)]
    print(
        f"current / baseline ({args.baseline}), best decode per round: "
        f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
