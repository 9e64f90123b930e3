"""Where the engine's CPU goes in a DSpark generation with every step drafting, against plain.

One greedy generation of the chat prompt of ``vs_transformers.py`` per configuration and
round, alternated over ``--repeats`` rounds: plain decoding, and ``--drafts k`` forced on every
step with no gate, once with the drafter's compiled greedy block (``DSparkDrafter.use_native``,
what the engine runs) and once on its torch modules. One torch thread, profiled with
``cProfile`` on the thread's CPU clock (a loaded machine's preemption does not count; the
profiler's own per-call cost does, so Python-heavy parts read a little high). Printed per
decode step: CPU ms of the engine's step and its parts (the model forward, the plain step's
head and argmax, the speculator's ``propose`` / ``accept`` and what they call), medians over
rounds with their range, and a drafting step against a plain one, from the profiled runs and
from the same generations run without the profiler (CPU ms of the thread per decode step), the
ratio to keep.

    .venv/bin/python benchmarks/engine_spec_split.py --tokens 40 --drafts 1 --repeats 3

``--baseline REV --rounds N`` instead compares revisions: child processes alternate the packages
at ``REV`` (a ``git archive`` with its own C sources, ``decode_step_python_ab.revision_tree``)
with the working tree (or ``--current REV``), ``N`` rounds each. A child times, without the
profiler, ``--repeats`` alternated greedy generations of plain decoding and of ``--drafts``
forced drafts (compiled block), each decode step by the thread's CPU clock at ``--threads 1``
or the wall clock otherwise (the prefill step is not counted), each followed by a profiled one
for the time inside the compiled kernels (the layer calls, the LM head, the drafter's calls).
Printed per side: plain and drafting CPU (or wall) ms per step, the drafting step over the
plain one (the figure to keep), what drafting adds outside the kernels (from profiled
generations, one after each timed one: the steps' difference less the kernels'), and the
floor: the ratio a drafting step would reach if it added nothing outside the kernels (``1 +
kernels' difference / plain step``). At ``--threads 2`` the kernels' time is the calling
thread's, so read those two at ``--threads 1``:

    .venv/bin/python benchmarks/engine_spec_split.py --baseline 8981c7e --rounds 4
    .venv/bin/python benchmarks/engine_spec_split.py --baseline 8981c7e --threads 2 --rounds 6
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from vs_transformers import CHAT_MESSAGES

from deepinfer import LLM, EngineConfig, SamplingParams, SpeculativeConfig
from deepinfer.models import load_model

# (label, file suffix, function name) of the parts reported.
PARTS = (
    ("engine step", "deepinfer/engine/engine.py", "step"),
    ("model forward", "deepinfer/engine/model_runner.py", "forward"),
    ("plain: head + argmax (sample)", "deepinfer/engine/model_runner.py", "sample"),
    ("speculator propose", "deepinfer/speculative/speculator.py", "propose"),
    ("  plan (context catch-up, gate)", "deepinfer_spec/batch_step.py", "plan"),
    ("  drafter context view", "deepinfer_spec/lazy_context.py", "view"),
    ("    context entries (flush)", "deepinfer_spec/lazy_context.py", "_flush"),
    ("  draft block", "deepinfer_spec/step.py", "draft_block"),
    ("    proposal", "deepinfer_spec/propose.py", "propose"),
    ("speculator accept", "deepinfer/speculative/speculator.py", "accept"),
    ("  target logits at verified rows", "deepinfer/speculative/speculator.py", "_verify_logits"),
    ("  verify block", "deepinfer_spec/step.py", "verify_block"),
    ("  greedy verdict's argmax", "deepinfer_spec/step.py", "target_argmax"),
    ("  context push", "deepinfer_spec/lazy_context.py", "push"),
)


def cumulative_ms(stats: pstats.Stats, suffix: str, name: str) -> float:
    table = stats.stats  # type: ignore[attr-defined]
    total = sum(
        entry[3]
        for (path, _, func), entry in table.items()
        if path.endswith(suffix) and func == name
    )
    return 1e3 * total


# (file suffix, function name) of the compiled kernels' Python entry points: the layer calls
# and the drafter's (NativeFunction), the LM head (the quantised product).
KERNELS = (
    ("deepinfer_kernels/cpu/native.py", "__call__"),
    ("deepinfer_kernels/quant/cpu.py", "linear"),
)


def _decode_steps(llm: LLM, ids: list[int], params: SamplingParams, clock: Any) -> list[float]:
    """Seconds of each decode step of one generation (its first step, the prefill, untimed)."""
    engine = llm.engine
    engine.add_request(ids, params)
    engine.step()
    times = []
    while engine.has_unfinished():
        start = clock()
        engine.step()
        times.append(clock() - start)
    return times


def child(args: argparse.Namespace) -> None:
    """One side of ``--baseline``: JSON of ms per decode step, plain and drafting."""
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    loaded = load_model()
    ids = loaded.tokenizer.encode(loaded.chat_template.render(CHAT_MESSAGES))
    cfg = EngineConfig(num_blocks=1024, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    forced = SpeculativeConfig("dspark", num_speculative_tokens=args.drafts, draft_gate=False)
    sides = {
        "plain": LLM(loaded, engine_config=cfg, enable_prefix_caching=False),
        "drafting": LLM(loaded, engine_config=cfg, enable_prefix_caching=False, speculative=forced),
    }
    for llm in sides.values():
        _decode_steps(llm, ids, params, clock)  # warm-up: packed weights, bound steps
    ms: dict[str, list[float]] = {name: [] for name in sides}
    # Per profiled generation: ms per step inside the kernels, and the whole step's.
    inside: dict[str, list[float]] = {name: [] for name in sides}
    profiled: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.repeats):
        for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
            steps = _decode_steps(sides[name], ids, params, clock)
            ms[name].append(1e3 * sum(steps) / len(steps))
            profile = cProfile.Profile(time.thread_time)
            profile.enable()
            steps = _decode_steps(sides[name], ids, params, time.thread_time)
            profile.disable()
            stats = pstats.Stats(profile)
            kernel_ms = sum(cumulative_ms(stats, suffix, func) for suffix, func in KERNELS)
            inside[name].append(kernel_ms / len(steps))
            profiled[name].append(1e3 * sum(steps) / len(steps))
    kernels: dict[str, float] = {}
    for name in sides:
        kernels[name] = statistics.median(inside[name])
        kernels[name + " profiled step"] = statistics.median(profiled[name])
    print(json.dumps({"ms": ms, "kernels": kernels}))


def compare(args: argparse.Namespace) -> None:
    """Alternate the baseline's packages and the current ones in child processes."""
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    from decode_step_python_ab import revision_tree

    with tempfile.TemporaryDirectory(prefix="spec-split-ab-") as tmp:
        sides: dict[str, str | None] = {
            "baseline": revision_tree(args.baseline, Path(tmp) / "baseline"),
            "current": revision_tree(args.current, Path(tmp) / "current") if args.current else None,
        }
        ratio: dict[str, list[float]] = {name: [] for name in sides}
        drafting: dict[str, list[float]] = {name: [] for name in sides}
        outside: dict[str, list[float]] = {name: [] for name in sides}
        floor: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
                env = dict(os.environ)
                if sides[name] is not None:
                    env["PYTHONPATH"] = f"{sides[name]}{os.pathsep}{env.get('PYTHONPATH', '')}"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
                cmd += ["--tokens", str(args.tokens), "--drafts", str(args.drafts)]
                cmd += ["--repeats", str(args.repeats), "--threads", str(args.threads)]
                # Outside the checkout, so the baseline's packages are not shadowed.
                done = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir()
                )
                if done.returncode != 0:
                    raise SystemExit(f"{name} child failed:\n{done.stderr[-4000:]}")
                got = json.loads(done.stdout.strip().splitlines()[-1])
                plain, draft = (statistics.median(got["ms"][k]) for k in ("plain", "drafting"))
                k = got["kernels"]
                # What drafting adds inside the kernels and outside them, both from the
                # profiled generations (the profiler inflates the Python outside a little).
                inside = k["drafting"] - k["plain"]
                ratio[name].append(draft / plain)
                drafting[name].append(draft)
                added = k["drafting profiled step"] - k["plain profiled step"] - inside
                outside[name].append(added)
                # The ratio a drafting step would reach if it added no Python to the plain
                # step's, on the same kernels.
                floor[name].append(1.0 + inside / plain)
                print(
                    f"round {r + 1} {name:8s}: plain {plain:.2f}, drafting {draft:.2f} ms/step "
                    f"({draft / plain:.3f}x); drafting adds {inside:.2f} inside the kernels, "
                    f"{added:.2f} outside; load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    clock = "thread CPU" if args.threads == 1 else f"wall, {args.threads} threads"
    for name in sides:
        rev = args.baseline if name == "baseline" else args.current or "working tree"
        r = ratio[name]
        extra, low = outside[name], floor[name]
        print(
            f"{name} ({rev}): drafting step / plain step {statistics.median(r):.3f}x "
            f"({min(r):.3f}-{max(r):.3f}, {clock}); drafting adds outside the kernels "
            f"{statistics.median(extra):.2f} ms/step ({min(extra):.2f}-{max(extra):.2f}); "
            f"with none, the kernels' floor {statistics.median(low):.3f}x "
            f"({min(low):.3f}-{max(low):.3f})"
        )
    saved = [b / c for b, c in zip(drafting["baseline"], drafting["current"], strict=True)]
    print(
        f"drafting step speed, current / baseline: {statistics.median(saved):.3f}x "
        f"({min(saved):.3f}-{max(saved):.3f})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--drafts", type=int, default=1, help="drafts verified on every step")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", help="git revision to compare with (see the module doc)")
    p.add_argument("--current", help="with --baseline: a revision instead of the working tree")
    p.add_argument("--rounds", type=int, default=4, help="child runs per side with --baseline")
    p.add_argument("--threads", type=int, default=1, help="kernel threads with --baseline")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tokens < 3 or min(args.drafts, args.repeats, args.rounds, args.threads) < 1:
        p.error("--tokens must be >= 3; --drafts, --repeats, --rounds and --threads >= 1")
    if args.child:
        child(args)
        return
    if args.baseline:
        compare(args)
        return
    torch.set_num_threads(1)
    loaded = load_model()
    ids = loaded.tokenizer.encode(loaded.chat_template.render(CHAT_MESSAGES))
    cfg = EngineConfig(num_blocks=1024, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    forced = SpeculativeConfig("dspark", num_speculative_tokens=args.drafts, draft_gate=False)
    plain = LLM(loaded, engine_config=cfg, enable_prefix_caching=False)
    spec = LLM(loaded, engine_config=cfg, enable_prefix_caching=False, speculative=forced)
    speculator = spec.engine.speculator
    assert speculator is not None
    drafter = speculator.drafter  # type: ignore[attr-defined]
    native = drafter.native
    configs = {"plain": (plain, None), f"{args.drafts} drafts, compiled block": (spec, native)}
    configs[f"{args.drafts} drafts, torch modules"] = (spec, None)
    if native is None:
        print("the compiled block is unavailable here: both drafting rows run the modules")
    per_step: dict[str, dict[str, list[float]]] = {name: {} for name in configs}
    unprofiled: dict[str, list[float]] = {name: [] for name in configs}
    steps_of: dict[str, int] = {}
    for llm, _ in configs.values():
        llm.generate([ids], params)  # warm-up: packed weights, bound steps
    for _ in range(args.repeats):
        for name, (llm, kernel) in configs.items():
            if llm is spec:
                drafter.use_native(kernel)
            # The whole generation without the profiler first (its per-call cost inflates
            # Python-heavy parts): the step ratios to keep.
            steps0 = speculator.stats.num_steps  # type: ignore[attr-defined]
            start = time.thread_time()
            llm.generate([ids], params)
            seconds = time.thread_time() - start
            steps = args.tokens - 1
            if llm is spec:
                steps = speculator.stats.num_steps - steps0  # type: ignore[attr-defined]
            unprofiled[name].append(1e3 * seconds / max(1, steps))
            steps0 = speculator.stats.num_steps  # type: ignore[attr-defined]
            profile = cProfile.Profile(time.thread_time)
            profile.enable()
            llm.generate([ids], params)
            profile.disable()
            stats = pstats.Stats(profile)
            steps = args.tokens - 1
            if llm is spec:
                steps = speculator.stats.num_steps - steps0  # type: ignore[attr-defined]
            steps_of[name] = steps
            for label, suffix, func in PARTS:
                ms = cumulative_ms(stats, suffix, func)
                per_step[name].setdefault(label, []).append(ms / max(1, steps))
    drafter.use_native(native)
    base = statistics.median(per_step["plain"]["engine step"])
    for name, parts in per_step.items():
        print(f"{name} ({steps_of[name]} decode steps for {args.tokens - 1} tokens):")
        for label, values in parts.items():
            if max(values) > 0:
                med = statistics.median(values)
                print(
                    f"  {label:34s} {med:7.2f} ms CPU per step ({min(values):.2f}-"
                    f"{max(values):.2f}); {med / base:.2f} of a plain step"
                )
    for name in list(configs)[1:]:
        for how, table in (("profiled", None), ("unprofiled", unprofiled)):
            ours = per_step[name]["engine step"] if table is None else table[name]
            base_steps = per_step["plain"]["engine step"] if table is None else table["plain"]
            ratios = [d / b for d, b in zip(ours, base_steps)]
            print(
                f"{name}: a drafting step is {statistics.median(ratios):.2f}x a plain step "
                f"({min(ratios):.2f}-{max(ratios):.2f}, per round; {how}, whole generation "
                f"per step: {statistics.median(ours):.1f} vs {statistics.median(base_steps):.1f}"
                " ms CPU)"
            )


if __name__ == "__main__":
    main()
