"""Prefill through the engine with the current Python against that of an earlier commit, the
same C kernels on both sides, in alternating child processes:

    .venv/bin/python benchmarks/prefill_python_ab.py --baseline REV [--parts prefill,batch]
        [--prefill 2048] [--repeats 2] [--rounds 3]

The prefill counterpart of ``decode_step_python_ab.py`` (whose baseline tree it reuses: the
Python of every package at ``REV`` with the current checkout's C sources). What differs is the
Python of a many-row step: how projections call the dequantise + GEMM path, how the attention
plan cuts a long causal chunk. A child loads the embedded GGUF on one thread and times, in CPU
seconds of the process (``time.process_time``, far less disturbed by a loaded machine than wall
time), the parts of ``vs_llamacpp.py`` that are mostly prefill:

- ``prefill``: one ``--prefill``-token prompt, one new token;
- ``batch``: 16 code-editing prompts of ~76 tokens, 16 new tokens each (one prefill step of
  ~1.2k rows, then 15 steps of 16 rows).

Prints CPU seconds per side and round and the speed ratio current / baseline per part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step_python_ab import _baseline_tree
from vs_llamacpp import CODE_PROMPT

PARTS = ("prefill", "batch")


def _child(parts: list[str], prefill: int, repeats: int) -> int:
    import torch

    torch.set_num_threads(1)
    from deepinfer import LLM, EngineConfig, SamplingParams
    from deepinfer.models import default_model_path

    ctx = prefill + 128
    llm = LLM(
        str(default_model_path()),
        engine_config=EngineConfig(max_model_len=ctx, num_blocks=-(-ctx // 16) * 17),
        enable_prefix_caching=False,
    )
    long_prompt = llm.encode(CODE_PROMPT * 200)[:prefill]
    batch = [llm.encode(f"Question {i}: " + CODE_PROMPT) for i in range(16)]
    work = {
        "prefill": ([long_prompt], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)),
        "batch": (batch, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)),
    }

    def run(part: str) -> float:
        prompts, params = work[part]
        start = time.process_time()
        llm.generate(prompts, params)
        return time.process_time() - start

    out: dict[str, list[float]] = {}
    for part in parts:
        run(part)  # warm: kernels built, weights touched
        out[part] = [run(part) for _ in range(repeats)]
    print(json.dumps(out))
    return 0


def _run_side(pythonpath: str | None, args: argparse.Namespace) -> dict[str, list[float]]:
    import os
    import subprocess

    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--parts", args.parts]
    cmd += ["--prefill", str(args.prefill), "--repeats", str(args.repeats)]
    # Outside the checkout, so the baseline's packages are not shadowed by the current ones.
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"child ({pythonpath or 'current'}) failed:\n{done.stderr[-4000:]}")
    result: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision whose Python to compare with")
    parser.add_argument("--parts", default="prefill,batch", help="comma-separated: prefill, batch")
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts: expected a comma-separated subset of {', '.join(PARTS)}")
    if args.prefill < 1:
        parser.error("--prefill: must be >= 1")
    if args.child:
        return _child(parts, args.prefill, args.repeats)
    if not args.baseline:
        parser.error("--baseline: required (a git revision, e.g. 8c6a2ae)")
    ratios: dict[str, list[float]] = {p: [] for p in parts}
    with tempfile.TemporaryDirectory(prefix="prefill-python-ab-") as tmp:
        sides: dict[str, str | None] = {
            "baseline": _baseline_tree(args.baseline, Path(tmp)),
            "current": None,
        }
        for r in range(args.rounds):
            best: dict[str, dict[str, float]] = {}
            for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
                cpu = _run_side(sides[name], args)
                best[name] = {p: min(cpu[p]) for p in parts}
                shown = "; ".join(f"{p} " + ", ".join(f"{v:.2f}" for v in cpu[p]) for p in parts)
                print(f"round {r} {name:8s} CPU s: {shown}", flush=True)
            for p in parts:
                ratios[p].append(best["baseline"][p] / best["current"][p])
    for p in parts:
        v = ratios[p]
        print(
            f"{p}: current speed / baseline ({args.baseline}): {statistics.median(v):.2f}x "
            f"({min(v):.2f}-{max(v):.2f}), CPU seconds, one thread"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
