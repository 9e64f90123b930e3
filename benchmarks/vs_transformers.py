"""DeepInfer vs Hugging Face transformers on the embedded SmolLM2-135M-Instruct, same process.

Both sides run the shipped GGUF (Q4_1): DeepInfer through ``load_model()``, its own blocks
dequantised exactly in fp32 by the block-format decoder layer; transformers through
``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` (the ``gguf`` package dequantises
the same blocks to the same fp32 values), run in fp32. Up to deepinfer 0.11.0 the transformers
side loaded the bf16 copy ``deepinfer.models.convert_gguf`` writes, so the two did not run
exactly the same weights. Same machine, torch threads pinned. Measures:

1. greedy outputs token-identical to transformers' greedy over 20 prompts;
2. batch-1 greedy tokens/s without speculation vs transformers' ``generate``;
3. with DSpark (``LLM(speculative="dspark")``) vs transformers greedy, prompt lookup
   (``prompt_lookup_num_tokens``) and assisted generation with an assistant built from the
   same weights (the first ``--assistant-layers`` decoder layers + final norm + tied head), on
   a code-editing prompt and on a chat prompt (and the engine without DSpark on the same prompt);
4. 16 concurrent requests: total tokens/s vs transformers' padded (left-padded) batch generate,
   once with every request asking for ``--batch-tokens`` tokens and once with per-request
   lengths drawn lognormal (median ``--batch-tokens``, sigma 0.8, as in deepinfer_sched's
   synthetic chat trace); a padded batch runs until its longest request is done.

Tokens/s is end to end (prefill included) over ``--tokens`` new tokens; EOS is ignored on both
sides (``ignore_eos`` / ``min_new_tokens``) so both generate the same count.

    .venv/bin/python benchmarks/vs_transformers.py --tokens 64 --out benchmarks/results/engine_spec.md
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.models import default_model_path, load_model

CODE_PROMPT = """Rename the function `compute_total` to `sum_prices` and update every call.

```python
def compute_total(items):
    total = 0
    for item in items:
        total += item.price * item.quantity
    return total


def report(cart):
    total = compute_total(cart.items)
    print(f"Items: {len(cart.items)}")
    print(f"Total: {total:.2f}")
    return total
```

Here is the updated code:

```python
"""

CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Give me three tips for writing clear Python code."},
]

CHECK_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "import numpy as np\n",
    "The three primary colors are",
    "Water boils at",
    "class Stack:\n    def __init__(self):",
    "A haiku about autumn:",
    "SELECT name FROM users WHERE",
    "The quick brown fox",
    "In machine learning, overfitting means",
    "for i in range(10):",
    "My favourite fruit is",
    "The Pythagorean theorem states",
    "To make a cup of tea,",
    "#include <stdio.h>\nint main() {",
    "The largest planet in the solar system",
    "Q: What is 2 + 2?\nA:",
    "Dear hiring manager,",
    "git commit -m",
]


def timed(fns: dict[str, Callable[[], int]], repeats: int) -> dict[str, tuple[float, int]]:
    """Run every function ``repeats`` times, interleaved (A B C A B C ...) so that drift in the
    machine's speed hits all of them alike; per function the median wall time and the tokens
    one run produced."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), tokens[name]) for name in fns}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=48, help="new tokens for the speed runs")
    p.add_argument("--check-tokens", type=int, default=16, help="new tokens per identity check")
    p.add_argument("--check-prompts", type=int, default=20)
    p.add_argument("--batch", type=int, default=16, help="concurrent requests")
    p.add_argument("--batch-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="seed of the mixed output lengths")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    p.add_argument(
        "--only-batch", action="store_true", help="run only the concurrent-request comparison"
    )
    p.add_argument("--assistant-layers", type=int, default=6)
    p.add_argument("--lookup", type=int, default=5, help="prompt_lookup_num_tokens")
    p.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    gguf = default_model_path()
    loaded = load_model(gguf)
    tok = loaded.tokenizer
    # transformers reads the shipped GGUF itself (dequantised by the gguf package, run in fp32):
    # both sides run exactly the same weight values.
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                              dtype=torch.float32)  # fmt: skip
    hf.eval()  # type: ignore[no-untyped-call]
    assistant = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
        num_hidden_layers=args.assistant_layers,
    )  # fmt: skip
    assistant.eval()  # type: ignore[no-untyped-call]
    cfg = EngineConfig(num_blocks=1024, max_num_seqs=max(32, args.batch))
    plain = LLM(loaded, engine_config=cfg, enable_prefix_caching=False)
    spec = LLM(loaded, engine_config=cfg, enable_prefix_caching=False, speculative="dspark")
    rows: list[tuple[str, str]] = []
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    def hf_generate(ids: list[int], n: int, model: object = hf, **kw: object) -> list[int]:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = model.generate(  # type: ignore[attr-defined]
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=tok.eos_token_ids[0],
                **kw,
            )
        return [int(t) for t in out[0, len(ids) :]]

    def ours(llm: LLM, ids: list[int], n: int) -> list[int]:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return llm.generate([ids], params)[0].token_ids

    def count_ours(llm: LLM, ids: list[int], n: int) -> int:
        return len(ours(llm, ids, n))

    def count_hf(ids: list[int], n: int, **kw: object) -> int:
        return len(hf_generate(ids, n, **kw))

    if not args.only_batch:
        # 1. token identity
        check = [tok.encode(t) for t in CHECK_PROMPTS[: args.check_prompts]]
        params = SamplingParams(temperature=0, max_tokens=args.check_tokens, ignore_eos=True)
        mine = [o.token_ids for o in plain.generate(check, params)]
        mine_spec = [o.token_ids for o in spec.generate(check, params)]
        theirs = [hf_generate(ids, args.check_tokens) for ids in check]
        same = sum(a == b for a, b in zip(mine, theirs))
        same_spec = sum(a == b for a, b in zip(mine_spec, theirs))
        log(f"identity: plain {same}/{len(check)}, dspark {same_spec}/{len(check)} prompts equal")
        rows.append(
            (
                "greedy token-identical to transformers (fp32)",
                f"{same}/{len(check)} plain, {same_spec}/{len(check)} with DSpark",
            )
        )

        chat_ids = tok.encode(loaded.chat_template.render(CHAT_MESSAGES))
        code_ids = tok.encode(CODE_PROMPT)
        n = args.tokens
        # warm-up both engines once
        ours(plain, code_ids, 4), ours(spec, code_ids, 4), hf_generate(code_ids, 4)

        # 2. batch-1 greedy without speculation
        got = timed(
            {
                "ours": functools.partial(count_ours, plain, chat_ids, n),
                "hf": functools.partial(count_hf, chat_ids, n),
            },
            args.repeats,
        )
        r_plain, r_hf = (got[x][1] / got[x][0] for x in ("ours", "hf"))
        log(f"batch-1 greedy chat: deepinfer {r_plain:.1f} tok/s, transformers {r_hf:.1f} tok/s")
        rows.append(
            (
                "batch-1 greedy tok/s, no speculation (chat prompt)",
                f"{r_plain:.1f} vs {r_hf:.1f} = **{r_plain / r_hf:.2f}x** (target >= 1.2x)",
            )
        )

        # 3. DSpark vs transformers greedy and assisted modes
        for name, ids in (("code-editing", code_ids), ("chat", chat_ids)):
            before = spec.engine.speculator.stats  # type: ignore[union-attr]
            rows0, emit0 = before.num_rows, before.num_emitted
            ver0 = before.num_verified
            got = timed(
                {
                    "dspark": functools.partial(count_ours, spec, ids, n),
                    "plain": functools.partial(count_ours, plain, ids, n),
                    "greedy": functools.partial(count_hf, ids, n),
                    "lookup": functools.partial(
                        count_hf, ids, n, prompt_lookup_num_tokens=args.lookup
                    ),
                    "assistant": functools.partial(count_hf, ids, n, assistant_model=assistant),
                },
                args.repeats,
            )
            st = spec.engine.speculator.stats  # type: ignore[union-attr]
            tau = (st.num_emitted - emit0) / max(1, st.num_rows - rows0)
            verified = (st.num_verified - ver0) / max(1, st.num_rows - rows0)
            r_spec, r_ours, r_g, r_pl, r_as = (
                got[x][1] / got[x][0] for x in ("dspark", "plain", "greedy", "lookup", "assistant")
            )
            best = max(r_pl, r_as)
            log(
                f"{name}: dspark {r_spec:.1f} tok/s (tau {tau:.2f}, verified/step {verified:.2f}); "
                f"deepinfer plain {r_ours:.1f} ({r_spec / r_ours:.2f}x); "
                f"hf greedy {r_g:.1f}, prompt lookup {r_pl:.1f}, assistant {r_as:.1f}"
            )
            rows.append(
                (
                    f"DSpark batch-1 tok/s, {name} prompt (tau {tau:.2f})",
                    f"{r_spec:.1f} vs hf greedy {r_g:.1f} = **{r_spec / r_g:.2f}x** (target >= 2x); "
                    f"vs best assisted {best:.1f} (lookup {r_pl:.1f}, assistant {r_as:.1f}) = "
                    f"**{r_spec / best:.2f}x** (target >= 1.3x); deepinfer without DSpark "
                    f"{r_ours:.1f} ({r_spec / r_ours:.2f}x)",
                )
            )

    # 4. concurrent requests: all arrive at once; a uniform and a mixed-length workload
    batch_prompts = [tok.encode(t) for t in (CHECK_PROMPTS * 2)[: args.batch]]
    rng = np.random.default_rng(args.seed)
    # Output lengths lognormal with sigma 0.8 (the spread deepinfer_sched's synthetic chat trace
    # uses), median --batch-tokens, clipped to [4, 8 x median].
    mixed = np.clip(
        np.rint(args.batch_tokens * np.exp(0.8 * rng.standard_normal(args.batch))),
        4,
        8 * args.batch_tokens,
    ).astype(int)
    workloads = {
        "uniform": [args.batch_tokens] * args.batch,
        "mixed": [int(x) for x in mixed],
    }

    def ours_batch(lengths: list[int]) -> int:
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
        return sum(len(o.token_ids) for o in plain.generate(batch_prompts, params))

    def hf_batch(lengths: list[int]) -> int:
        # One padded batch runs until its longest request is done; a request's tokens past its
        # own max_tokens are discarded, so only the requested tokens count.
        width = max(len(x) for x in batch_prompts)
        pad = tok.eos_token_ids[0]
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch_prompts])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch_prompts])
        longest = max(lengths)
        with torch.inference_mode():
            out = hf.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                pad_token_id=pad,
            )
        return sum(min(n, out.shape[1] - width) for n in lengths)

    ours_batch([4] * args.batch), hf_batch([4] * args.batch)  # warm-up at this batch size
    for name, lengths in workloads.items():
        got = timed(
            {
                "ours": functools.partial(ours_batch, lengths),
                "hf": functools.partial(hf_batch, lengths),
            },
            args.repeats,
        )
        (t_ours, k_ours), (t_hfb, k_hfb) = got["ours"], got["hf"]
        r_ours, r_hfb = k_ours / t_ours, k_hfb / t_hfb
        log(
            f"{args.batch} concurrent, {name} max_tokens {lengths}: deepinfer {r_ours:.1f} tok/s "
            f"({t_ours:.1f} s), transformers padded {r_hfb:.1f} tok/s ({t_hfb:.1f} s)"
        )
        rows.append(
            (
                f"{args.batch} concurrent requests, {name} lengths "
                f"(sum {sum(lengths)}, longest {max(lengths)} tokens), total tok/s",
                f"{r_ours:.1f} vs {r_hfb:.1f} = **{r_ours / r_hfb:.2f}x** (target >= 3x)",
            )
        )

    cmd = ".venv/bin/python " + " ".join(sys.argv)
    table = ["| measurement | result |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    report = "\n".join(
        [
            f"Command: `{cmd}`",
            "",
            f"torch threads {args.threads}, {args.tokens} new tokens per speed run, fp32, CPU, "
            f"median of {args.repeats} interleaved runs per figure. "
            f"Assistant model: the first {args.assistant_layers} of 30 layers of the same weights.",
            "",
            *table,
            "",
            "Log:",
            "",
            *[f"    {line}" for line in lines],
        ]
    )
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
