"""A/B in one process: the engine's ``sample_next_tokens`` now against an earlier revision's.

The earlier ``sampler.py``, ``logits_processing.py`` and ``logprobs.py`` are read from git
(``--rev``, default 5ae9f4f: before #19 moved their tensor work into ``deepinfer_kernels``)
into a temporary directory and imported beside the current ones. Both draw on the batches of
``bench_sampling_params.py`` (B = 32, V = 49152, one intra-op thread), alternated; every pair
must return the same tokens. Prints the median and range of new/old time ratios per case::

    .venv/bin/python benchmarks/ab_engine_sampler.py --repeats 7
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
OLD = {"sampler": "old_sampler", "logits_processing": "old_lp", "logprobs": "old_logprobs"}


def load_old(rev: str, into: Path):  # type: ignore[no-untyped-def]
    for name, alias in OLD.items():
        shown = subprocess.run(
            ["git", "show", f"{rev}:deepinfer/engine/{name}.py"],
            cwd=HERE.parent,
            capture_output=True,
            text=True,
        )
        if shown.returncode != 0:
            continue  # a module that revision does not have (logprobs.py merged into sampler.py)
        text = shown.stdout
        for other, other_alias in OLD.items():
            text = text.replace(
                f"from deepinfer.engine.{other} import", f"from {other_alias} import"
            )
        (into / f"{alias}.py").write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module("old_sampler")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="5ae9f4f")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    import bench_sampling_params as b

    from deepinfer.engine import sampler as new

    with tempfile.TemporaryDirectory() as tmp:
        old = load_old(args.rev, Path(tmp))
        logits = torch.randn(b.B, b.V, generator=torch.Generator().manual_seed(1))
        for case, params in b.CASES.items():
            seqs = b._seqs(params)
            ratios = []
            for _ in range(args.repeats):
                g_new, g_old = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
                t0 = time.perf_counter()
                got = new.sample_next_tokens(seqs, logits, g_new)
                t1 = time.perf_counter()
                want = old.sample_next_tokens(seqs, logits, g_old)
                t2 = time.perf_counter()
                if got != want:
                    raise SystemExit(f"{case}: the two samplers returned different tokens")
                ratios.append((t1 - t0) / (t2 - t1))
            ratios.sort()
            print(
                f"{case:>12}: new/old median {statistics.median(ratios):.2f}x "
                f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}), same tokens"
            )


if __name__ == "__main__":
    main()
