"""Where the memory of a `deepinfer generate` run goes, phase by phase (#24 item 2).

Runs in a fresh process (this one: run it directly, never import it into a process that already
loaded torch) and prints, after each start-up phase, the kernel's own counters from
``/proc/self/status``: ``VmRSS`` (resident now), ``VmHWM`` (the peak so far), ``RssAnon``
(anonymous: heap, Python objects, tensors we allocated) and ``RssFile`` (file-backed: library
text and memory-mapped weight files), plus the resident bytes of the weight file's mappings
(``/proc/self/smaps``). The phases follow what `deepinfer generate` does:

    interpreter -> numpy -> torch -> deepinfer (the CLI's imports) -> load weights + tokenizer
    -> engine (KV pool, sampler) -> first step (prefill) -> decode -> close

``--cli`` instead runs ``deepinfer.cli.main(["generate", ...])`` itself and prints only the
end figures (the peak RSS of the command line as a user runs it), and the heavy optional
modules it imported.

    .venv/bin/python benchmarks/engine_memory.py --tokens 32 --max-model-len 2176
    .venv/bin/python benchmarks/engine_memory.py --cli --tokens 32 --max-model-len 2176

Absolute RSS depends on the machine (library versions, THP settings, glibc); the phase
differences are the record. ``vs_llamacpp.py --rss-only`` compares the peak with llama.cpp's.
"""

from __future__ import annotations

import sys
import time

_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
PROMPT = "Write a Python function that reverses a string."
# Optional dependencies a plain generate must not import (each costs 2-143 MB of RSS on
# import: torch._dynamo 143, triton 71, ray 35, transformers 19, fastapi 14);
# tests/deepinfer/test_memory_footprint.py holds the same list. jinja2 (the chat template, ~1 MB)
# and tqdm (torch.hub imports it) are expected.
HEAVY = ("triton", "transformers", "xgrammar", "llguidance", "fastapi", "uvicorn", "starlette",
         "ray", "gguf", "matplotlib", "scipy", "pandas", "sympy", "prometheus_client", "openai",
         "huggingface_hub", "torch._dynamo", "torch._inductor")  # fmt: skip


def status() -> dict[str, int]:
    """The memory counters of ``/proc/self/status`` in KiB."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in _FIELDS:
                out[key] = int(value.split()[0])
    return out


def mapped_rss(suffix: str) -> int:
    """Resident KiB of this process's mappings of files whose name ends in ``suffix``."""
    total, current = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
                current = len(head) >= 6 and head[5].endswith(suffix)
            elif current and line.startswith("Rss:"):
                total += int(head[1])
    return total


def heavy_imported() -> list[str]:
    return sorted(m for m in HEAVY if m in sys.modules)


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, int], int, str]] = []

    def phase(self, name: str, note: str = "") -> None:
        self.rows.append((name, status(), mapped_rss(".st") + mapped_rss(".gguf"), note))

    def print(self) -> None:
        print("| phase | VmRSS MB | VmHWM MB | RssAnon MB | RssFile MB | weight file MB | note |")
        print("|---|---|---|---|---|---|---|")
        prev = 0
        for name, s, weights, note in self.rows:
            delta = f" (+{(s['VmRSS'] - prev) / 1024:.0f})" if prev else ""
            print(
                f"| {name} | {s['VmRSS'] / 1024:.0f}{delta} | {s['VmHWM'] / 1024:.0f} | "
                f"{s['RssAnon'] / 1024:.0f} | {s['RssFile'] / 1024:.0f} | {weights / 1024:.0f} | "
                f"{note} |"
            )
            prev = s["VmRSS"]


def run_phases(tokens: int, max_model_len: int, prefix_cache: bool) -> None:
    table = Table()
    table.phase("interpreter")
    import numpy  # noqa: F401

    table.phase("import numpy")
    import torch

    table.phase("import torch")
    from deepinfer.cli import build_parser

    build_parser()
    from deepinfer import LLM, EngineConfig, SamplingParams
    from deepinfer.models.kv_pool import blocks_for_context
    from deepinfer.models.loader import load_model

    table.phase("import deepinfer", ", ".join(heavy_imported()) or "no heavy optional module")
    start = time.perf_counter()
    loaded = load_model(None)
    weight_bytes = sum(t.nbytes for t in loaded.model.state_dict().values())
    table.phase("weights + tokenizer", f"model tensors {weight_bytes / 2**20:.0f} MB")
    blocks = blocks_for_context(max_model_len, 1, 16)
    config = EngineConfig(max_model_len=max_model_len, num_blocks=blocks)
    llm = LLM(loaded, engine_config=config, enable_prefix_caching=prefix_cache)
    del loaded
    table.phase("engine + KV pool", f"{blocks} blocks")
    greedy = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate([PROMPT], greedy)
    table.phase("first step (prefill)")
    greedy = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate([PROMPT], greedy)
    table.phase(f"decode {tokens} tokens", f"{time.perf_counter() - start:.1f} s since load")
    llm.close()
    table.phase("LLM.close()")
    table.print()
    print(f"\nheavy optional modules imported: {heavy_imported() or 'none'}")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")


def run_cli(tokens: int, max_model_len: int, prefix_cache: bool) -> None:
    import contextlib
    import io

    from deepinfer.cli import main

    args = ["generate", PROMPT, "--max-tokens", str(tokens), "--temperature", "0",
            "--max-model-len", str(max_model_len)]  # fmt: skip
    if not prefix_cache:
        args.append("--no-prefix-cache")
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(args)
    s = status()
    print(f"deepinfer {' '.join(args[:1])} (rc {rc}): peak RSS (VmHWM) {s['VmHWM'] / 1024:.0f} MB,"
          f" end VmRSS {s['VmRSS'] / 1024:.0f} MB (anon {s['RssAnon'] / 1024:.0f}, "
          f"file {s['RssFile'] / 1024:.0f})")  # fmt: skip
    print(f"heavy optional modules imported: {heavy_imported() or 'none'}")


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=2176)
    parser.add_argument("--no-prefix-cache", action="store_true")
    parser.add_argument("--cli", action="store_true", help="run `deepinfer generate` itself")
    args = parser.parse_args()
    if "torch" in sys.modules:
        raise SystemExit("run this script in a fresh process")
    run = run_cli if args.cli else run_phases
    run(args.tokens, args.max_model_len, not args.no_prefix_cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
