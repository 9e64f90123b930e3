"""Where the engine's CPU goes in a DSpark generation with every step drafting, against plain.

One greedy generation of the chat prompt of ``vs_transformers.py`` per engine (plain, and
``--drafts k`` forced on every step with no gate), one torch thread, profiled with
``cProfile`` on the thread's CPU clock (a loaded machine's preemption does not count; the
profiler's own per-call cost does, so Python-heavy parts read a little high). Printed: CPU ms
of the whole run and of the engine's step parts (the model forward, the speculator's
``propose`` / ``accept``, the drafter context's view, the target's logits at verified rows),
and per step.

    .venv/bin/python benchmarks/engine_spec_split.py --tokens 40 --drafts 1
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from vs_transformers import CHAT_MESSAGES

from deepinfer import LLM, EngineConfig, SamplingParams, SpeculativeConfig
from deepinfer.models import load_model

# (label, file suffix, function name) of the parts reported.
PARTS = (
    ("engine step", "deepinfer/engine/engine.py", "step"),
    ("model forward", "deepinfer/engine/model_runner.py", "forward"),
    ("speculator propose", "deepinfer/speculative/speculator.py", "propose"),
    ("  drafter context view", "deepinfer_spec/lazy_context.py", "view"),
    ("  draft block", "deepinfer_spec/step.py", "draft_block"),
    ("speculator accept", "deepinfer/speculative/speculator.py", "accept"),
    ("  target logits at verified rows", "deepinfer/speculative/speculator.py", "_verify_logits"),
    ("  verify block", "deepinfer_spec/step.py", "verify_block"),
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
    args = p.parse_args()
    torch.set_num_threads(1)
    loaded = load_model()
    ids = loaded.tokenizer.encode(loaded.chat_template.render(CHAT_MESSAGES))
    cfg = EngineConfig(num_blocks=1024, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    forced = SpeculativeConfig("dspark", num_speculative_tokens=args.drafts, draft_gate=False)
    for label, spec in (("plain", None), (f"{args.drafts} drafts", forced)):
        llm = LLM(loaded, engine_config=cfg, enable_prefix_caching=False, speculative=spec)
        llm.generate([ids], params)  # warm-up: packed weights, bound steps
        speculator = llm.engine.speculator
        steps0 = speculator.stats.num_steps if speculator is not None else 0  # type: ignore[attr-defined]
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        llm.generate([ids], params)
        profile.disable()
        stats = pstats.Stats(profile)
        steps = args.tokens - 1
        tau = ""
        if speculator is not None:
            st = speculator.stats  # type: ignore[attr-defined]
            steps = st.num_steps - steps0
            tau = f", {args.tokens - 1} decode tokens in {steps} drafting steps"
        print(f"{label}{tau}:")
        for name, suffix, func in PARTS:
            ms = cumulative_ms(stats, suffix, func)
            if ms:
                print(f"  {name:36s} {ms:8.1f} ms CPU ({ms / max(1, steps):.2f} per decode step)")


if __name__ == "__main__":
    main()
