"""Batch-1 greedy decode of the embedded model on its GGUF block-format weights (the default
since #24) against the previous default, its bf16-rounded converted copy run in fp32 on the
bf16-panel kernels; same process, alternated, one thread unless told otherwise.

    .venv/bin/python benchmarks/gguf_decode_paths.py [--tokens 32] [--repeats 3] [--threads 1]

Prints tokens/s per path and run, and the ratio block-format / bf16-copy (median, range).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "deepinfer"))


def main() -> int:
    from model_helpers import greedy_paged

    from deepinfer.models import default_model_path, load_model
    from deepinfer.models.convert import convert_gguf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    source = default_model_path()
    models = {"gguf-blocks": load_model(source).model,
              "bf16-copy": load_model(convert_gguf(source)).model}  # fmt: skip
    prompt = load_model(source).tokenizer.encode("def reverse(s):\n    ")
    rates: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        greedy_paged(model, prompt, 4)  # warm: kernels built, weights touched
    for _ in range(args.repeats):
        for name, model in models.items():
            start = time.perf_counter()
            greedy_paged(model, prompt, args.tokens)
            rates[name].append(args.tokens / (time.perf_counter() - start))
    for name, values in rates.items():
        print(f"{name:12s} tok/s: " + ", ".join(f"{v:.1f}" for v in values))
    ratios = [a / b for a, b in zip(rates["gguf-blocks"], rates["bf16-copy"])]
    print(f"gguf-blocks / bf16-copy: {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
