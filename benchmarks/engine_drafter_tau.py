"""How many tokens a DSpark drafter lets the engine emit per drafting step (tau), on the
code-editing and chat prompts of ``vs_transformers.py``, with every draft verified.

Each drafter directory (a ``deepinfer-spec`` checkpoint) is run in the engine with
``FixedGammaScheduler(gamma)`` and no gate, greedy; tau counts the bonus/correction token
(1 = no draft accepted). ``--draft-vocab N`` also runs each drafter restricted to the ``N``
most frequent tokens of the training corpus (``draft_vocabulary`` of the drafter's training
recipe, ``recipes/dspark_smollm2/train_drafter.py``), and the
drafter's own forward time is reported for each (``deepinfer.speculative.time_draft``).

    .venv/bin/python benchmarks/engine_drafter_tau.py --drafter deepinfer/data/dspark-smollm2 \\
        --drafter /tmp/run/ --draft-vocab 16384
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from vs_transformers import CHAT_MESSAGES, CODE_PROMPT

# The draft vocabulary is the training recipe's (its corpus), not a benchmark's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes" / "dspark_smollm2"))
from train_drafter import draft_vocabulary

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.models import load_model
from deepinfer.speculative import build_speculator, time_draft
from deepinfer.speculative.speculator import DSparkSpeculator
from deepinfer_spec import DSparkDrafter, FixedGammaScheduler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--drafter", type=Path, action="append", required=True)
    p.add_argument("--draft-vocab", type=int, action="append", default=[])
    p.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    tok = loaded.tokenizer
    prompts = {
        "code-editing": tok.encode(CODE_PROMPT),
        "chat": tok.encode(loaded.chat_template.render(CHAT_MESSAGES)),
    }
    order = draft_vocabulary(tok, max(args.draft_vocab)) if args.draft_vocab else None
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    for directory in args.drafter:
        llm = LLM(loaded, engine_config=EngineConfig(num_blocks=512), enable_prefix_caching=False)
        eng = llm.engine
        base = build_speculator(
            directory, eng.model, eng.pool, max_seqs=8, scheduler=FixedGammaScheduler(1), gate=None
        )
        assert isinstance(base, DSparkSpeculator)
        variants: dict[str, DSparkDrafter] = {"all tokens": base.drafter}
        for size in args.draft_vocab:
            assert order is not None
            variants[f"{size} tokens"] = base.drafter.restrict_vocab(order[:size])
        for name, drafter in variants.items():
            gamma = drafter.config.gamma
            # Through the composition root: a speculator assigned to a built engine afterwards
            # is never consulted (the batch policy grants it no look-ahead slots).
            spec = DSparkSpeculator(drafter, FixedGammaScheduler(gamma), max_seqs=8)
            drafting = LLM(
                loaded,
                engine_config=EngineConfig(num_blocks=512, max_num_seqs=8),
                enable_prefix_caching=False,
                speculative=spec,
            )
            taus = []
            for prompt_name, ids in prompts.items():
                stats = spec.stats
                rows0, emit0 = stats.num_rows, stats.num_emitted
                drafting.generate([ids], params)
                taus.append(
                    f"{prompt_name} {(stats.num_emitted - emit0) / max(1, stats.num_rows - rows0):.2f}"
                )
            drafting.close()
            ms = 1e3 * time_draft(drafter, repeats=10)
            print(
                f"{directory} ({name}): tau {', '.join(taus)}; drafter forward {ms:.1f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
