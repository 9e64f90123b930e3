"""Self-distillation corpus for the DSpark drafter: the target's own responses to prompts built
from the Python standard library, written as JSONL token ids (``deepinfer_spec.training.read_jsonl``).

A drafter is judged on the text the *target* writes, not on the corpus it was trained on. The
stdlib corpus is source code; in the engine the target answers chat questions and rewrites code,
and a drafter trained on source only agrees with the target's top-1 on ~4% of chat positions.
This script asks the target itself: prompts are made from the training half of the stdlib
(``train_drafter.corpus_files(held_out=False)``) so that nothing comes from the held-out files or
from ``vs_transformers.py``'s benchmark prompts:

- chat (the model's chat template): questions about a module or function, "write a function
  that <docstring summary>", "give N tips about <topic>", code review of a short function;
- code editing (plain completion, the code-editing benchmark's shape): an instruction (rename,
  add a docstring, add type hints, simplify), the function in a fenced block, then
  "Here is the updated code:" and an open fence.

``--prompts shaped`` (session 17) weights the prompts towards the two shapes the engine
benchmarks decode: a list of tips in a chat answer and a code edit (including renames across a
function and its caller), ``build_shaped_prompts``; the default ``stdlib`` set is the one the
session-7/8 files were made from.

Each line is ``{"input_ids": prompt + response, "prompt_len": n, "kind": ...}``; responses are
greedy (what the benchmarks decode) except ``--sampled`` of them at temperature 0.7. Generation
runs batched through the engine; ``--minutes`` bounds it, and the file is appended to, so a run
can be resumed (prompts already written are skipped by index).

    .venv/bin/python recipes/dspark_smollm2/distill_corpus.py --out /tmp/distill.jsonl --minutes 20
    .venv/bin/python recipes/dspark_smollm2/distill_corpus.py --out /tmp/distill.jsonl --minutes 22 \
        --prompts shaped --seed 1 --sampled 0.1
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from train_drafter import corpus_files

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.models import load_model

TOPICS = [
    "debugging a slow program",
    "naming variables",
    "writing unit tests",
    "handling errors in a command-line tool",
    "organising a small project into modules",
    "reading CSV files",
    "working with dates and times",
    "using list comprehensions",
    "writing docstrings",
    "profiling code",
    "using virtual environments",
    "writing a good commit message",
    "learning a new programming language",
    "reviewing someone else's code",
    "using dictionaries effectively",
    "avoiding global variables",
    "logging in an application",
    "parsing command-line arguments",
    "working with files and paths",
    "choosing between a list and a tuple",
    "writing readable functions",
    "using regular expressions",
    "concurrency with threads",
    "making code faster",
    "using type hints",
]
SYSTEMS = [None, "You are a helpful assistant.", "You are a concise Python expert."]
EDITS = [
    "Add a docstring to the function `{name}`.",
    "Add type hints to the function `{name}`.",
    "Rename the function `{name}` to `{new}` and update every call.",
    "Simplify the function `{name}` without changing what it does.",
    "Add comments explaining the function `{name}`.",
]


def _functions(path: Path) -> Iterator[tuple[str, str, str]]:
    """``(name, source, docstring summary)`` of the short top-level functions of a file."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.end_lineno is None:
            continue
        if not 3 <= node.end_lineno - node.lineno <= 25:
            continue
        source = ast.get_source_segment(text, node)
        doc = (ast.get_docstring(node) or "").strip().split("\n")[0].rstrip(".")
        if source:
            yield node.name, source, doc


def build_prompts(chat_template: object, seed: int) -> list[tuple[str, str]]:
    """``(kind, prompt text)`` pairs from the stdlib's training half, in a shuffled order."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []

    def chat(user: str) -> str:
        system = rng.choice(SYSTEMS)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        return str(chat_template.render(messages))  # type: ignore[attr-defined]

    for topic in TOPICS:
        for n in (3, 5):
            out.append(("chat", chat(f"Give me {n} tips about {topic}.")))
        out.append(("chat", chat(f"Explain {topic} to a beginner.")))
    for path in corpus_files(held_out=False):
        module = path.stem if path.stem != "__init__" else path.parent.name
        out.append(("chat", chat(f"What is the Python module `{module}` used for?")))
        for name, source, doc in _functions(path):
            roll = rng.random()
            if roll < 0.3 and len(doc) > 12:
                task = doc[0].lower() + doc[1:]
                out.append(("chat", chat(f"Write a Python function that does this: {task}.")))
            elif roll < 0.5:
                ask = rng.choice(["What does this function do?", "Review this code."])
                out.append(("chat", chat(f"```python\n{source}\n```\n{ask}")))
            elif roll < 0.8:
                edit = rng.choice(EDITS).format(name=name, new=f"{name.strip('_')}_v2")
                out.append(
                    (
                        "code",
                        f"{edit}\n\n```python\n{source}\n```\n\nHere is the updated code:\n\n"
                        "```python\n",
                    )
                )
    rng.shuffle(out)
    return out


TIP_COUNTS = ["3", "4", "5", "three", "four", "five"]
TIP_FORMS = [
    "Give me {n} tips for {topic}.",
    "Give me {n} tips about {topic}.",
    "What are {n} good habits for {topic}?",
    "List {n} common mistakes in {topic} and how to avoid them.",
]


def _call_pairs(path: Path) -> Iterator[tuple[str, str]]:
    """``(name, source)`` of two adjacent short top-level functions of a file where the second
    calls the first: the shape of a rename that must also update a call."""
    funcs = list(_functions(path))
    for (name, src, _), (_, caller, _) in itertools.pairwise(funcs):
        if f"{name}(" in caller:
            yield name, f"{src}\n\n\n{caller}"


def build_shaped_prompts(chat_template: object, seed: int) -> list[tuple[str, str]]:
    """Prompts weighted towards the two shapes the engine benchmarks decode (an assistant's list
    of tips; a code edit answered after "Here is the updated code:"), still from the stdlib's
    training half and never the benchmark prompts themselves: about 45% code edits (a third of
    them a rename across a function and its caller), 30% tips-style chat, 25% other chat."""
    rng = random.Random(seed)

    def chat(user: str) -> str:
        system = rng.choice(SYSTEMS)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        return str(chat_template.render(messages))  # type: ignore[attr-defined]

    def edit(instruction: str, source: str) -> str:
        return (
            f"{instruction}\n\n```python\n{source}\n```\n\nHere is the updated code:\n\n```python\n"
        )

    tips = [
        chat(form.format(n=n, topic=topic))
        for topic in TOPICS
        for n in TIP_COUNTS
        for form in TIP_FORMS
    ]
    tips += [chat(f"Explain {topic} to a beginner.") for topic in TOPICS]
    codes: list[str] = []
    pairs: list[str] = []
    other: list[str] = []
    for path in corpus_files(held_out=False):
        module = path.stem if path.stem != "__init__" else path.parent.name
        other.append(chat(f"What is the Python module `{module}` used for?"))
        for name, source, doc in _functions(path):
            instruction = rng.choice(EDITS).format(name=name, new=f"{name.strip('_')}_v2")
            codes.append(edit(instruction, source))
            if len(doc) > 12:
                task = doc[0].lower() + doc[1:]
                other.append(chat(f"Write a Python function that does this: {task}."))
            else:
                ask = rng.choice(["What does this function do?", "Review this code."])
                other.append(chat(f"```python\n{source}\n```\n{ask}"))
        for name, source in _call_pairs(path):
            new = rng.choice([f"{name.strip('_')}_v2", f"new_{name.strip('_')}"])
            pairs.append(
                edit(f"Rename the function `{name}` to `{new}` and update every call.", source)
            )
    pools = [("code", pairs), ("code", codes), ("chat", tips), ("chat", other)]
    for _, pool in pools:
        rng.shuffle(pool)
    weights = [0.15, 0.30, 0.30, 0.25]
    out: list[tuple[str, str]] = []
    while all(pool for _, pool in pools):
        kind, pool = rng.choices(pools, weights)[0]
        out.append((kind, pool.pop()))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSONL file (appended to)")
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--max-tokens", type=int, default=160, help="response length cap")
    p.add_argument("--max-prompt", type=int, default=384, help="skip longer prompts (tokens)")
    p.add_argument("--batch", type=int, default=24, help="prompts per engine batch")
    p.add_argument("--sampled", type=float, default=0.25, help="fraction sampled at T=0.7")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--prompts",
        choices=["stdlib", "shaped"],
        default="stdlib",
        help="stdlib: the session-8 prompt set; shaped: weighted towards the benchmarks' shapes",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    tok = loaded.tokenizer
    build = build_shaped_prompts if args.prompts == "shaped" else build_prompts
    prompts = build(loaded.chat_template, args.seed)
    done = sum(1 for line in args.out.open()) if args.out.exists() else 0
    llm = LLM(loaded, engine_config=EngineConfig(num_blocks=2048), enable_prefix_caching=True)
    rng = random.Random(args.seed + done)
    deadline = time.monotonic() + args.minutes * 60
    tokens = 0
    start = time.monotonic()
    print(f"{len(prompts)} prompts, {done} already written", flush=True)
    with args.out.open("a") as sink:
        index = done
        while index < len(prompts) and time.monotonic() < deadline:
            group = prompts[index : index + args.batch]
            index += len(group)
            encoded = [(kind, tok.encode(text)) for kind, text in group]
            params = [
                SamplingParams(
                    temperature=0.7 if rng.random() < args.sampled else 0.0,
                    max_tokens=args.max_tokens,
                    seed=rng.randrange(2**31),
                )
                for _ in encoded
            ]
            keep = [i for i, (_, ids) in enumerate(encoded) if len(ids) <= args.max_prompt]
            outs = llm.generate([encoded[i][1] for i in keep], [params[i] for i in keep])
            written = dict(zip(keep, outs))
            for i, (kind, ids) in enumerate(encoded):
                out = written.get(i)
                # A skipped prompt still gets a line so that the resume index stays aligned.
                response = [] if out is None or out.error else list(out.token_ids)
                tokens += len(response)
                record = {
                    "input_ids": ids + response,
                    "prompt_len": len(ids),
                    "kind": kind,
                    "temperature": params[i].temperature,
                }
                sink.write(json.dumps(record) + "\n")
            sink.flush()
            rate = tokens / (time.monotonic() - start)
            print(f"{index}/{len(prompts)} prompts, {tokens} response tokens ({rate:.0f} tok/s)")


if __name__ == "__main__":
    main()
