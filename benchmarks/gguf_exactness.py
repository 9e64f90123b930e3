"""Is the engine running the checkpoint's model? Greedy output and logits of the embedded
SmolLM2-135M-Instruct Q4_1 GGUF against transformers loading the same file in fp32
(``gguf_file=``, dequantised by the ``gguf`` package): 20 short prompts x 48 tokens.

    .venv/bin/python benchmarks/gguf_exactness.py [--model FILE.gguf] [--tokens 48]

Prints, per prompt, whether the greedy tokens are identical (else the first differing
position) and the largest absolute logit difference over the prompt's positions; then the
totals. Issue #24's target: 20/20 identical, logits within 1e-4.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "deepinfer"))

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is the capital of France?",
    "Explain recursion in one sentence.",
    "def fibonacci(n):",
    "List three primary colors.",
    "Translate 'good morning' into Spanish.",
    "What does HTTP stand for?",
    "Rename the variable x to count in: x = x + 1",
    "Give me a haiku about the sea.",
    "How many legs does a spider have?",
    "Fix the bug: for i in range(10) print(i)",
    "What is 12 times 12?",
    "Name a famous physicist.",
    "Write a SQL query that counts rows in a table named users.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "What is a linked list?",
    "Convert 100 degrees Fahrenheit to Celsius.",
    "Add type hints: def add(a, b): return a + b",
    "Tell me a fun fact about octopuses.",
]


def main() -> int:
    import transformers
    from model_helpers import greedy_paged  # the engine's paged path, one token per step

    from deepinfer.models import AttentionMetadata, KVPool, default_model_path, load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    path = Path(args.model) if args.model else default_model_path()
    torch.set_num_threads(1)
    loaded = load_model(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    same, worst = 0, 0.0
    for text in PROMPTS:
        ids = loaded.chat_template.render(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        prompt = loaded.tokenizer.encode(ids)
        pool = KVPool.for_model(loaded.config, -(-len(prompt) // 16), 16)
        attn = AttentionMetadata.build([pool.allocate(pool.num_blocks)], [len(prompt)],
                                       [len(prompt)], 16)  # fmt: skip
        with torch.inference_mode():
            hidden = loaded.model(torch.tensor(prompt), attn.positions(), attn, pool)
            ours_logits = loaded.model.compute_logits(hidden)
            ref_logits = theirs(torch.tensor([prompt])).logits[0].float()
            ref = theirs.generate(
                torch.tensor([prompt]),
                max_new_tokens=args.tokens,
                do_sample=False,
                eos_token_id=None,  # neither stop at nor suppress EOS: plain argmax
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        ours = greedy_paged(loaded.model, prompt, args.tokens)
        diff = float((ours_logits - ref_logits).abs().max())
        worst = max(worst, diff)
        first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
        same += first is None
        verdict = "identical" if first is None else f"differs at token {first}"
        print(f"{verdict:>20}  max |dlogit| {diff:.2e}  {text[:50]}", flush=True)
    print(f"greedy identical: {same}/{len(PROMPTS)}; max |logit difference|: {worst:.2e}")
    return 0 if same == len(PROMPTS) and worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
