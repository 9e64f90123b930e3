"""Where a batch-1 greedy decode step of the engine goes, against the lean runtime's step.

    .venv/bin/python benchmarks/engine_decode_overhead.py [--tokens 128] [--repeats 3]
        [--threads 1] [--json PATH]

Both runtimes load the embedded SmolLM2-135M Q4_1 GGUF in this process and decode ``--tokens``
greedy tokens (EOS ignored) after ``vs_llamacpp.py``'s code-editing prompt, alternated
``--repeats`` times. Times are CPU seconds of this thread (``time.thread_time``; at one kernel
thread that is the whole step's work, and a loaded machine disturbs it far less than wall time)
and wall seconds, from the first streamed token to the last (the prefill is not counted).

The engine (``LLM.stream``) step is split into the model forward (``forward_with_layers``: the
compiled layer kernels and their Python binding), the LM head (``compute_logits``), the rest of
sampling (greedy: the argmax and its checks) and everything else (scheduler, block table,
runner input tensors and attention metadata, output processing, detokenisation, the client's
generator). The lean step (``LeanLLM.stream``) is split into ``LeanModel.decode`` (layers and
LM head) and everything else (sampler, detokeniser, stop checks). The split wraps the two model
objects in timing proxies of this script (the library code runs unchanged).

Prints ms per step of each part (median over repeats, with min-max), and the lean / engine
decode speed ratio per repeat in CPU time and wall time.

``--baseline REV --rounds N`` instead runs this measurement in child processes, alternating the
packages at ``REV`` with those at ``--current`` (a revision; default: the working tree), each a
``git archive`` with its own C sources (``--same-c`` gives the baseline the current checkout's C
files instead, as ``decode_step_python_ab.py`` does, when the C ABI did not change between the
two), and prints each side's engine and lean CPU ms per step, the lean / engine ratio, the
engine's CPU ms per step outside the model's forward and LM head (its own Python: far steadier
under load than the whole step, and the same measure whatever kernels each side compiled), and
the current engine's speed over the baseline's:

    .venv/bin/python benchmarks/engine_decode_overhead.py --baseline a183eab --current HEAD
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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_llamacpp import CODE_PROMPT


class PartClock:
    """Accumulated thread CPU time and wall time of named parts, reset per measured run."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.on = False

    def reset(self) -> None:
        self.cpu, self.wall = {}, {}

    def timed(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self.on:
            return fn(*args, **kwargs)
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - c0
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w0


class TimedEngineModel:
    """Delegates to the engine's model, timing the forward and the LM head."""

    def __init__(self, model: Any, clock: PartClock) -> None:
        self._model, self._clock = model, clock

    def forward_with_layers(self, *args: Any, **kwargs: Any) -> Any:
        return self._clock.timed("forward", self._model.forward_with_layers, *args, **kwargs)

    def compute_logits(self, *args: Any, **kwargs: Any) -> Any:
        return self._clock.timed("lm_head", self._model.compute_logits, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class TimedRunner:
    """Delegates to the engine's model runner, timing ``sample`` (LM head included)."""

    def __init__(self, runner: Any, clock: PartClock) -> None:
        self._runner, self._clock = runner, clock

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        return self._clock.timed("sample", self._runner.sample, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


class TimedLeanModel:
    """Delegates to the lean runtime's model, timing its one-token step."""

    def __init__(self, model: Any, clock: PartClock) -> None:
        self._model, self._clock = model, clock

    def decode(self, token: int) -> Any:
        return self._clock.timed("decode", self._model.decode, token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def measure(
    stream: Iterable[Any], count: Callable[[Any], int], new: int, clock: PartClock
) -> dict[str, Any]:
    """Drain ``stream``; per-step CPU and wall ms of each part from its first output to its last."""
    first_cpu = first_wall = None
    produced = 0
    clock.on = False
    for out in stream:
        if first_cpu is None:
            clock.reset()
            clock.on = True
            first_cpu, first_wall = time.thread_time(), time.perf_counter()
        produced = count(out)
    cpu, wall = time.thread_time(), time.perf_counter()
    clock.on = False
    assert first_cpu is not None and first_wall is not None and produced == new, produced
    steps = new - 1
    return {
        "cpu_ms": (cpu - first_cpu) / steps * 1e3,
        "wall_ms": (wall - first_wall) / steps * 1e3,
        "parts_cpu_ms": {k: v / steps * 1e3 for k, v in clock.cpu.items()},
        "parts_wall_ms": {k: v / steps * 1e3 for k, v in clock.wall.items()},
    }


def engine_split(run: dict[str, Any], key: str) -> dict[str, float]:
    parts = run[f"parts_{key}_ms"]
    forward, head, sample = (
        parts.get("forward", 0.0),
        parts.get("lm_head", 0.0),
        parts.get("sample", 0.0),
    )
    total = run[f"{key}_ms"]
    return {
        "forward": forward,
        "lm_head": head,
        "argmax": sample - head,
        "other": total - forward - sample,
        "total": total,
    }


def lean_split(run: dict[str, Any], key: str) -> dict[str, float]:
    decode = run[f"parts_{key}_ms"].get("decode", 0.0)
    total = run[f"{key}_ms"]
    return {"decode (layers + head)": decode, "other": total - decode, "total": total}


def _row(name: str, values: list[float]) -> str:
    return f"  {name:24s} {statistics.median(values):7.3f} ms ({min(values):.3f}-{max(values):.3f})"


def _child_run(pythonpath: str | None, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One measurement in a child process (``pythonpath``: the baseline's packages first)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--tokens", str(args.tokens),
           "--repeats", str(args.repeats), "--threads", str(args.threads), "--json", str(out)]  # fmt: skip
    # Outside the checkout, so the baseline's packages are not shadowed by the current ones.
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"child ({pythonpath or 'current'}) failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def compare(args: argparse.Namespace) -> int:
    """Alternate the baseline's Python and the current one in child processes (module doc)."""
    from decode_step_python_ab import _baseline_tree, revision_tree

    with tempfile.TemporaryDirectory(prefix="engine-overhead-ab-") as tmp:
        base = Path(tmp) / "baseline"
        sides: dict[str, str | None] = {
            "baseline": _baseline_tree(args.baseline, base) if args.same_c
            else revision_tree(args.baseline, base),
            "current": revision_tree(args.current, Path(tmp) / "current") if args.current else None,
        }  # fmt: skip
        engine: dict[str, list[float]] = {name: [] for name in sides}
        ratio: dict[str, list[float]] = {name: [] for name in sides}
        outside: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
                runs = _child_run(sides[name], args, Path(tmp) / f"{name}-{r}.json")["runs"]
                e = statistics.median(run["engine"]["cpu_ms"] for run in runs)
                lean = statistics.median(run["lean"]["cpu_ms"] for run in runs)
                # The step less the model's forward and LM head: the engine's own Python, far
                # less disturbed by the machine's load than the kernels' time.
                own = statistics.median(
                    engine_split(run["engine"], "cpu")["total"]
                    - engine_split(run["engine"], "cpu")["forward"]
                    - engine_split(run["engine"], "cpu")["lm_head"]
                    for run in runs
                )
                engine[name].append(e)
                ratio[name].append(e / lean)
                outside[name].append(own)
                print(f"round {r + 1} {name:8s}: engine {e:.3f} (outside the model {own:.3f}), "
                      f"lean {lean:.3f} CPU ms/step, lean/engine {e / lean:.3f}x; "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    for name in sides:
        own_ms = outside[name]
        rev = args.baseline if name == "baseline" else args.current or "working tree"
        print(f"{name} ({rev}): lean/engine "
              f"{_median_range(ratio[name])}; outside the model {statistics.median(own_ms):.3f} "
              f"CPU ms/step ({min(own_ms):.3f}-{max(own_ms):.3f})")  # fmt: skip
    speed = [b / c for b, c in zip(engine["baseline"], engine["current"], strict=True)]
    saved = [b - c for b, c in zip(engine["baseline"], engine["current"], strict=True)]
    print(f"engine decode speed, current / baseline: {_median_range(speed)}; CPU ms saved per "
          f"step {statistics.median(saved):.3f} ({min(saved):.3f}-{max(saved):.3f})")  # fmt: skip
    return 0


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}x ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    ap.add_argument("--repeats", type=int, default=3, help="alternated engine / lean runs")
    ap.add_argument("--threads", type=int, default=1, help="kernel threads (torch and OpenMP)")
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    ap.add_argument("--baseline", help="git revision whose Python to alternate with (children)")
    ap.add_argument("--current", help="with --baseline: the other revision (default: the "
                    "working tree)")  # fmt: skip
    ap.add_argument("--same-c", action="store_true",
                    help="with --baseline: the baseline runs the current checkout's C sources")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=4, help="child runs per side with --baseline")
    args = ap.parse_args(argv)
    if args.tokens < 3 or args.repeats < 1 or args.threads < 1 or args.rounds < 1:
        ap.error("--tokens must be >= 3, --repeats, --threads and --rounds >= 1")
    if args.baseline:
        return compare(args)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from deepinfer import LLM, EngineConfig, SamplingParams
    from deepinfer.lean import LeanLLM, LeanSampling
    from deepinfer.models import default_model_path

    path = str(default_model_path())
    ctx = 1024
    llm = LLM(path, engine_config=EngineConfig(max_model_len=ctx, num_blocks=-(-ctx // 16) + 8),
              enable_prefix_caching=False)  # fmt: skip
    lean = LeanLLM(path, max_model_len=ctx, threads=args.threads)
    clock = PartClock()
    engine = llm.engine
    engine.runner.model = TimedEngineModel(engine.runner.model, clock)  # type: ignore[assignment]
    engine.runner = TimedRunner(engine.runner, clock)  # type: ignore[assignment]
    assert lean.model is not None
    lean.model = TimedLeanModel(lean.model, clock)  # type: ignore[assignment]
    prompt_ids = llm.encode(CODE_PROMPT)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    lean_params = LeanSampling(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    # One untimed run each: the kernels' first-use builds and page faults.
    measure(llm.stream(prompt_ids, params), lambda o: len(o.token_ids), args.tokens, clock)
    measure(lean.stream(CODE_PROMPT, lean_params), lambda o: len(o.token_ids), args.tokens, clock)
    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        e = measure(llm.stream(prompt_ids, params), lambda o: len(o.token_ids), args.tokens, clock)
        lr = measure(
            lean.stream(CODE_PROMPT, lean_params), lambda o: len(o.token_ids), args.tokens, clock
        )
        runs.append({"engine": e, "lean": lr})
        print(f"repeat {repeat + 1}: engine {e['cpu_ms']:.3f} CPU-ms/step, lean {lr['cpu_ms']:.3f}; "
              f"lean/engine {e['cpu_ms'] / lr['cpu_ms']:.3f}x CPU, {e['wall_ms'] / lr['wall_ms']:.3f}x wall",
              flush=True)  # fmt: skip
    for key in ("cpu", "wall"):
        print(f"\nper decode step, {key} time, median (min-max) of {args.repeats}:")
        print(" engine (LLM.stream):")
        es = [engine_split(r["engine"], key) for r in runs]
        for name in es[0]:
            print(_row(name, [s[name] for s in es]))
        print(" lean (LeanLLM.stream):")
        ls = [lean_split(r["lean"], key) for r in runs]
        for name in ls[0]:
            print(_row(name, [s[name] for s in ls]))
        ratios = [r["engine"][f"{key}_ms"] / r["lean"][f"{key}_ms"] for r in runs]
        print(f" lean/engine decode speed: {statistics.median(ratios):.3f}x "
              f"({min(ratios):.3f}-{max(ratios):.3f})")  # fmt: skip
    print(f"\nload average: {os.getloadavg()}")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
