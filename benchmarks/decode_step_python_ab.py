"""Batch-1 greedy decode through the engine with the current Python against that of an earlier
commit, the same C kernels on both sides, in alternating child processes:

    .venv/bin/python benchmarks/decode_step_python_ab.py --baseline REV [--tokens 64]
        [--repeats 2] [--rounds 3]

The mirror of ``gguf_decode_ab.py`` (which swaps the C sources): the baseline is the Python of
``deepinfer`` and every ``deepinfer_*`` package at ``REV`` (``git archive``) with the C sources
(``*.c``, ``*.h``) of the current checkout, so the compiled code is the same and what differs is
the Python around it: binding the layer calls, planning the attention, sampling, the engine.
A child runs ``LLM(embedded GGUF).stream`` on one thread and times each decode token (first
streamed token to last) in CPU seconds of its thread (``time.thread_time``), which a loaded
machine disturbs far less than wall time. Prints ms of CPU per decode step per side and round,
and the saving per step (baseline - current; same compiled code, so it is Python time).
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
# Where each package's Python lives in the checkout (the integration package at the root).
PACKAGE_ROOTS = (".", "deepinfer_kernels/src", "deepinfer_cache/src", "deepinfer_sched/src",
                 "deepinfer_spec/src")  # fmt: skip


def _child(tokens: int, repeats: int) -> int:
    import torch

    torch.set_num_threads(1)
    from deepinfer import LLM, EngineConfig, SamplingParams
    from deepinfer.models import default_model_path

    llm = LLM(
        str(default_model_path()),
        engine_config=EngineConfig(max_model_len=1024, num_blocks=80),
        enable_prefix_caching=False,
    )
    prompt = llm.encode("def reverse(s):\n    return")
    params = SamplingParams(temperature=0, max_tokens=tokens + 1, ignore_eos=True)

    def decode() -> float:
        first, count = None, 0
        for out in llm.stream(prompt, params):
            first = time.thread_time() if first is None else first
            count = len(out.token_ids)
        assert first is not None and count == tokens + 1, count
        return (time.thread_time() - first) / tokens * 1e3

    decode()  # warm: kernels built, weights touched
    print(json.dumps({"ms": [decode() for _ in range(repeats)]}))
    return 0


def revision_tree(rev: str, into: Path) -> str:
    """``rev``'s packages with its own C sources, extracted under ``into``; their PYTHONPATH
    (the A/B scripts' way to run another revision beside the working tree)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return os.pathsep.join(str(into / p) for p in PACKAGE_ROOTS)


def _baseline_tree(rev: str, into: Path) -> str:
    """``rev``'s Python packages with the current C sources; returns their PYTHONPATH."""
    pythonpath = revision_tree(rev, into)
    for c in (ROOT / "deepinfer_kernels" / "src").rglob("*"):
        if c.suffix in (".c", ".h") and c.is_file():
            target = into / c.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(c, target)
    return pythonpath


def _run_side(pythonpath: str | None, args: argparse.Namespace) -> list[float]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
    cmd += ["--tokens", str(args.tokens), "--repeats", str(args.repeats)]
    # Outside the checkout, so the baseline's packages are not shadowed by the current ones.
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"child ({pythonpath or 'current'}) failed:\n{done.stderr[-4000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1])["ms"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision whose Python to compare with")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.tokens, args.repeats)
    if not args.baseline:
        parser.error("--baseline: required (a git revision, e.g. 451d7d7)")
    with tempfile.TemporaryDirectory(prefix="decode-python-ab-") as tmp:
        sides: dict[str, str | None] = {
            "baseline": _baseline_tree(args.baseline, Path(tmp)),
            "current": None,
        }
        best: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
                ms = _run_side(sides[name], args)
                best[name].append(min(ms))
                print(f"round {r} {name:8s} CPU ms/step: " + ", ".join(f"{v:.2f}" for v in ms))
    saved = [b - c for b, c in zip(best["baseline"], best["current"], strict=True)]
    ratio = [b / c for b, c in zip(best["baseline"], best["current"], strict=True)]
    print(
        f"per decode step, baseline ({args.baseline}) - current: {statistics.median(saved):.2f} "
        f"ms CPU ({min(saved):.2f}-{max(saved):.2f}); current speed / baseline: "
        f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
