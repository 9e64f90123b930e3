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
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--drafts", type=int, default=1, help="drafts verified on every step")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
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
