"""A device-tier prefix hit, blocks shared in place vs copied first: TTFT and CPU time (#19 item 5).

The device-tier rows of ``engine_ttft_cache.py`` alone, for a loaded machine. Two ``LLM``s over
one loaded model, each with the prefix cache's device tier only; "copied" hides the cache's
``share`` (``engine_ttft_cache.copy_only``), so a hit copies the cached blocks into fresh ones,
the path before block sharing. Both are seeded with the same prefix, then interleaved: every
repeat sends each a new suffix behind that prefix (``max_tokens=1``) and records TTFT
(``RequestOutput.metrics.ttft``) and the process's CPU seconds over the call
(``time.process_time``: what other processes' load cannot stretch, unlike wall time). The
figure is the per-repeat ratio shared / copied, as a range.

    .venv/bin/python benchmarks/engine_ttft_device_hit.py --prompt-len 1000 --cached-len 960
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from engine_ttft_cache import ONE_TOKEN, copy_only, token_run

from deepinfer import LLM, EngineConfig
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.models import load_model


def hit(llm: LLM, prompt: list[int]) -> tuple[float, float, int]:
    """(TTFT s, process CPU s, cached tokens) of one request."""
    cpu = time.process_time()
    out = llm.generate([prompt], ONE_TOKEN)[0]
    cpu = time.process_time() - cpu
    if out.error is not None or out.metrics is None or out.metrics.ttft is None:
        raise RuntimeError(f"request failed: {out.error}")
    return out.metrics.ttft, cpu, out.metrics.num_cached_tokens


def span(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}x ({min(values):.3f}..{max(values):.3f})"


def run(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    loaded = load_model()
    vocab, bs = loaded.config.vocab_size, args.block_size
    if not bs <= args.cached_len < args.prompt_len:
        raise ValueError("--cached-len must be in [block_size, prompt_len)")
    blocks = -(-(args.prompt_len + 1) // bs)
    cfg = EngineConfig(
        block_size=bs,
        num_blocks=2 * blocks + 8,
        max_batched_tokens=max(2048, args.prompt_len),
        max_model_len=max(args.prompt_len + 16, 256),
    )
    device = PrefixCacheConfig(device_blocks=cfg.num_blocks // 2, host_bytes=0, disk_bytes=0)
    prefix = token_run(vocab, args.cached_len, seed=1)

    def prompt(seed: int) -> list[int]:
        return prefix + token_run(vocab, args.prompt_len - args.cached_len, seed=1000 + seed)

    shared = LLM(loaded, engine_config=cfg, prefix_cache_config=device)
    copied = LLM(loaded, engine_config=cfg, prefix_cache_config=device)
    copy_only(copied)
    for llm in (shared, copied):  # seed the prefix (a cold prefill), then one warm-up hit
        hit(llm, prompt(0))
        hit(llm, prompt(1))
    rows: dict[str, list[tuple[float, float, int]]] = {"shared": [], "copied": []}
    for r in range(args.repeats):
        # Alternate which goes first, so a load change within a repeat hits both alike.
        order = [("shared", shared), ("copied", copied)]
        for name, llm in order if r % 2 == 0 else order[::-1]:
            rows[name].append(hit(llm, prompt(10 + 2 * r + (name == "copied"))))
        s, c = rows["shared"][-1], rows["copied"][-1]
        print(f"repeat {r}: shared {s[0]:.3f}s/{s[1]:.3f} cpu-s, copied {c[0]:.3f}s/{c[1]:.3f}")
    shared.close()
    copied.close()
    expected = args.cached_len // bs * bs
    s, c = rows["shared"], rows["copied"]
    lines = [
        "# Device-tier prefix hit: blocks shared in place vs copied first",
        "",
        f"Embedded SmolLM2-135M-Instruct, fp32, CPU, torch threads = {args.threads}, prompt "
        f"{args.prompt_len} tokens of which {args.cached_len} were run before ({expected} "
        f"cacheable in {bs}-token blocks), `max_tokens=1`, {args.repeats} interleaved repeats "
        "(order alternating). CPU = `time.process_time()` over `LLM.generate` (all threads).",
        "",
        "| device hit | TTFT median (s) | TTFT min..max (s) | CPU median (s) | cached (min) |",
        "|---|---|---|---|---|",
    ]
    for name, m in rows.items():
        t, cpu = [x[0] for x in m], [x[1] for x in m]
        lines.append(
            f"| {name} | {statistics.median(t):.3f} | {min(t):.3f}..{max(t):.3f} "
            f"| {statistics.median(cpu):.3f} | {min(x[2] for x in m)} |"
        )
    lines += [
        "",
        f"Shared / copied per repeat, median (range): TTFT {span([a[0] / b[0] for a, b in zip(s, c)])}, "
        f"CPU {span([a[1] / b[1] for a, b in zip(s, c)])}. Every hit served {expected} cached "
        f"tokens: {all(x[2] == expected for m in rows.values() for x in m)}.",
        "",
        "Reproduce:",
        "",
        "```",
        ".venv/bin/python " + shlex.join(sys.argv),
        "```",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-len", type=int, default=1000)
    p.add_argument("--cached-len", type=int, default=960)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = p.parse_args()
    report = run(args)
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
