"""``deepinfer generate --runtime {auto,lean,engine}``: which runtime runs a request, and the
lean one's command (the engine's stays in ``deepinfer.cli``).

``auto`` (the default) picks the lean runtime when the model is a GGUF file on the CPU and
every option given is one it runs (:func:`unsupported_option` says which is not), else the
engine; ``lean`` with an option it does not run is a usage error naming the option. A model
the lean runtime cannot run (:class:`~deepinfer.lean.weights.UnsupportedModel`) or a machine
without the compiled kernels sends ``auto`` to the engine too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from deepinfer.lean.sampling import LeanSampling

RUNTIMES = ("auto", "lean", "engine")

# (flag, argparse dest, the value under which the lean runtime runs it)
_DEFAULT_ONLY = (
    ("--dtype", "dtype", "float32"),
    ("--device", "device", "cpu"),
    ("--speculative", "speculative", None),
    ("--num-blocks", "num_blocks", None),
    ("--kv-memory", "kv_memory", None),
    ("--cache-dir", "cache_dir", None),
    ("--cache-disk-format", "cache_disk_format", "segments"),
    ("--cache-key-hash", "cache_key_hash", "xxh3_128"),
    ("--repetition-penalty", "repetition_penalty", 1.0),
    ("--presence-penalty", "presence_penalty", 0.0),
    ("--frequency-penalty", "frequency_penalty", 0.0),
    ("--regex", "regex", None),
    ("--json-schema", "json_schema", None),
)


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runtime",
        default="auto",
        choices=RUNTIMES,
        help="'lean': the GGUF model on the C kernels without torch (less memory); 'engine': "
        "the full engine; 'auto' (default): lean when the model is a GGUF file on the CPU and "
        "every option given is one lean runs",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument(
        "--stats",
        action="store_true",
        help="print one JSON line on stderr: the runtime, why, whether torch was imported, "
        "peak RSS, tokens and decode speed",
    )


def unsupported_option(args: argparse.Namespace) -> str | None:
    """The first option of ``args`` the lean runtime does not run, as ``--flag value``, or None."""
    model = getattr(args, "model", None)
    if model is not None and not (os.path.isfile(model) and Path(model).suffix == ".gguf"):
        return f"--model {model} (the lean runtime runs .gguf files)"
    for flag, dest, default in _DEFAULT_ONLY:
        value = getattr(args, dest, default)
        if value != default:
            return f"{flag} {value}"
    return None


def lean_sampling(args: argparse.Namespace) -> LeanSampling:
    """The sampling options as :class:`LeanSampling` (``ValueError`` naming a bad one)."""
    return LeanSampling(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        seed=args.seed,
        stop=tuple(args.stop or ()),
    )


def peak_rss_mb() -> float | None:
    """This process's peak resident set (``VmHWM``), MB; None where /proc is absent."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(x.split()[1]) / 1024 for x in fh if x.startswith("VmHWM"))
    except (OSError, StopIteration, ValueError):
        return None


def print_stats(runtime: str, reason: str, tokens: int, decode_s: float, started: float) -> None:
    """The ``--stats`` line (stderr): ``decode_tok_s`` counts tokens after each prompt's first."""
    stats = {
        "runtime": runtime,
        "reason": reason,
        "torch_imported": "torch" in sys.modules,
        "peak_rss_mb": peak_rss_mb(),
        "tokens": tokens,
        "decode_tok_s": None if decode_s <= 0 else round(tokens / decode_s, 2),
        "wall_s": round(time.perf_counter() - started, 3),
    }
    print(json.dumps(stats), file=sys.stderr)


def run_lean_generate(
    args: argparse.Namespace, llm: object, reason: str, error_line: object
) -> int:
    """``deepinfer generate`` on a :class:`~deepinfer.lean.LeanLLM` (the engine's output
    format: ``prompt + text`` per prompt, ``--json`` lines, ``--stream``)."""
    from deepinfer.lean.llm import LeanLLM

    assert isinstance(llm, LeanLLM)
    started = time.perf_counter()
    params = lean_sampling(args)
    status, decoded, decode_s = 0, 0, 0.0
    with llm:
        for prompt in args.prompts:
            first = None
            out = None
            for out in llm.stream(prompt, params):
                if out.error:
                    break
                if first is None:
                    first = time.perf_counter()
                if args.stream:
                    print(out.new_text, end="", flush=True)
            assert out is not None
            if first is not None and len(out.token_ids) > 1:
                decoded += len(out.token_ids) - 1
                decode_s += time.perf_counter() - first
            if out.error:
                status = 1
                if args.json:
                    print(json.dumps({"prompt": prompt, "text": "", "error": out.error}))
                else:
                    print(f"error: {error_line(out.error)}", file=sys.stderr)  # type: ignore[operator]
            elif args.stream:
                print()
            elif args.json:
                print(json.dumps({"prompt": prompt, "text": out.text, "error": None}))
            else:
                print(prompt + out.text)
    if args.stats:
        print_stats("lean", reason, decoded, decode_s, started)
    return status
