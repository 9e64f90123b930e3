"""The model side of the engine's batch-1 greedy decode step, split into its Python pieces.

    .venv/bin/python benchmarks/model_step_split.py [--tokens 128] [--repeats 3] [--json PATH]
    .venv/bin/python benchmarks/model_step_split.py --baseline REV [--current REV] [--rounds 4]

Loads the embedded SmolLM2-135M Q4_1 GGUF in ``LLM`` (one kernel thread), decodes ``--tokens``
greedy tokens after ``vs_llamacpp.py``'s code-editing prompt ``--repeats`` times (after one
untimed run) and prints, per decode step, the CPU time of this thread (``time.thread_time``)
spent in each of the model's pieces below, median (min-max) over the repeats. Pieces nest:
``LlamaModel.forward_with_layers`` holds ``_check_inputs``, ``RotaryEmbedding.cos_sin``, the
embedding lookup, ``_fused_layers`` (which holds ``LayerWeightCache.get``, the weights' currency
check) and ``_forward_fused`` (the compiled layers; it holds ``BoundSteps.get`` with
``BoundStep.norms_current``, ``BoundStep.load`` and ``BoundStep.bound_attention``).

The pieces are timed by wrapping those methods on their classes in this process only (the
measurement's own cost, ~1 us a call, is in the figures; both sides of an A/B pay it). Each
piece runs right after ~12 ms of kernels have evicted the interpreter's working set, which is
why it costs far more here than in a warm loop: this is the figure that matters.

``--baseline REV`` instead alternates child processes running this measurement over ``git
archive`` trees of REV and ``--current`` (a revision; default: the working tree), each with its
own C sources, and prints each piece's per-round medians for both sides.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = (".", "deepinfer_kernels/src", "deepinfer_cache/src", "deepinfer_sched/src",
                 "deepinfer_spec/src")  # fmt: skip


class PieceClock:
    """Thread CPU seconds accumulated per piece while ``on``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.on = False

    def wrap(self, owner: type, name: str) -> None:
        """Time ``owner.name`` (a method) under the label ``Owner.name``."""
        fn: Callable[..., Any] = getattr(owner, name)
        label = f"{owner.__name__}.{name}"

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.thread_time() - start

        setattr(owner, name, timed)


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """ms per decode step of each piece (and of the whole step), one value per repeat."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vs_llamacpp import CODE_PROMPT

    from deepinfer import LLM, EngineConfig, SamplingParams
    from deepinfer.models import default_model_path
    from deepinfer.models.fused_step import BoundStep, BoundSteps
    from deepinfer.models.llama import LlamaModel
    from deepinfer.models.quant_layers import QuantEmbedding
    from deepinfer.models.rope import RotaryEmbedding
    from deepinfer_kernels.cpu.decoder_panels import LayerWeightCache

    clock = PieceClock()
    pieces: list[tuple[type, str]] = [
        (LlamaModel, "forward_with_layers"),
        (LlamaModel, "_check_inputs"),
        (RotaryEmbedding, "cos_sin"),
        (QuantEmbedding, "forward"),
        (LlamaModel, "_fused_layers"),
        (LayerWeightCache, "get"),
        (LlamaModel, "_forward_fused"),
        (BoundSteps, "get"),
        (BoundStep, "norms_current"),
        (BoundStep, "load"),
        (BoundStep, "bound_attention"),
        (LlamaModel, "compute_logits"),
        (QuantEmbedding, "head_product"),
    ]
    for owner, name in pieces:
        clock.wrap(owner, name)
    ctx = 1024
    llm = LLM(str(default_model_path()),
              engine_config=EngineConfig(max_model_len=ctx, num_blocks=-(-ctx // 16) + 8),
              enable_prefix_caching=False)  # fmt: skip
    ids = llm.encode(CODE_PROMPT)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    steps = args.tokens - 1

    def run() -> dict[str, float]:
        clock.seconds, clock.on, first = {}, False, None
        for _ in llm.stream(ids, params):
            if first is None:  # from the first streamed token: decode steps only
                clock.on, first = True, time.thread_time()
        assert first is not None
        total = time.thread_time() - first
        clock.on = False
        return {"step": total / steps * 1e3} | {
            k: v / steps * 1e3 for k, v in clock.seconds.items()
        }

    run()
    runs = [run() for _ in range(args.repeats)]
    return {k: [r.get(k, 0.0) for r in runs] for k in runs[0]}


def _range(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} ({min(values):.3f}-{max(values):.3f})"


def compare(args: argparse.Namespace) -> None:
    """Alternate child processes over the two revisions' trees (module doc)."""

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from decode_step_python_ab import revision_tree

    with tempfile.TemporaryDirectory(prefix="model-step-split-") as tmp:
        sides: dict[str, str | None] = {
            "baseline": revision_tree(args.baseline, Path(tmp) / "baseline"),
            "current": revision_tree(args.current, Path(tmp) / "current") if args.current else None,
        }
        medians: dict[str, dict[str, list[float]]] = {name: {} for name in sides}
        for r in range(args.rounds):
            for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
                out = Path(tmp) / f"{name}-{r}.json"
                env = dict(os.environ)
                if sides[name] is not None:
                    env["PYTHONPATH"] = f"{sides[name]}{os.pathsep}{env.get('PYTHONPATH', '')}"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--tokens",
                       str(args.tokens), "--repeats", str(args.repeats), "--json", str(out)]  # fmt: skip
                # Outside the checkout, so the baseline's packages are not shadowed.
                done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      cwd=tempfile.gettempdir())  # fmt: skip
                if done.returncode != 0:
                    raise SystemExit(f"child {name} failed:\n{done.stderr[-4000:]}")
                for k, v in json.loads(out.read_text()).items():
                    medians[name].setdefault(k, []).append(statistics.median(v))
                print(f"round {r + 1} {name:8s} step {statistics.median(medians[name]['step'][-1:]):.3f}"
                      f" ms; load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    print(f"\nCPU ms per decode step, median (min-max) of {args.rounds} rounds' medians:")
    print(f"  {'piece':40s} {'baseline ' + args.baseline:>28s} {'current':>28s}")
    for k in medians["baseline"]:
        print(f"  {k:40s} {_range(medians['baseline'][k]):>28s} "
              f"{_range(medians['current'].get(k, [0.0])):>28s}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per process")
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    ap.add_argument("--baseline", help="git revision to alternate with (child processes)")
    ap.add_argument("--current", help="with --baseline: the other revision (default: the "
                    "working tree)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=4, help="child runs per side with --baseline")
    args = ap.parse_args(argv)
    if args.tokens < 3 or args.repeats < 1 or args.rounds < 1:
        ap.error("--tokens must be >= 3, --repeats and --rounds >= 1")
    if args.baseline:
        compare(args)
        return 0
    figures = measure(args)
    print(f"CPU ms per decode step, median (min-max) of {args.repeats}:")
    for k, v in figures.items():
        print(f"  {k:40s} {_range(v)}")
    print(f"load average: {os.getloadavg()}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
