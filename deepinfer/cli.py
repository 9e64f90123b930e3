"""The `deepinfer` command line: `generate`, `chat`, `bench`, `demo`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import NoReturn

from deepinfer.cli_errors import error_line, package_version
from deepinfer.cli_options import add_prefix_cache_args
from deepinfer.lean.cli import (
    add_runtime_args,
    lean_sampling,
    print_stats,
    run_lean_generate,
    unsupported_option,
)
from deepinfer.lean.model import KernelsUnavailable

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``deepinfer generate: error: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}  # fmt: skip


def _byte_size(text: str) -> int:
    """``"1.5GB"``, ``"512MiB"``, ``"1000000"`` -> bytes (argparse type)."""
    raw = text.strip().lower()
    number = raw.rstrip("kmgib")
    unit = raw[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected a size like 512MiB or 1.5GB, got {text!r}"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return int(value)


def _engine_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The engine config the pool flags ask for (None: the defaults)."""
    from deepinfer.engine.config import EngineConfig
    from deepinfer.models.kv_pool import blocks_for_context

    if args.num_blocks is None and args.max_model_len is None:
        return None
    config = EngineConfig(max_model_len=args.max_model_len)
    if args.num_blocks is not None:
        return replace(config, num_blocks=args.num_blocks)
    if args.kv_memory is None:  # sized to the context limit
        blocks = blocks_for_context(args.max_model_len, config.max_num_seqs, config.block_size)
        return replace(config, num_blocks=blocks)
    return config


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    add_prefix_cache_args(p)
    p.add_argument("--speculative", default=None, help="'dspark' or a drafter checkpoint dir")
    p.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context limit per request; sizes the pool to it unless --num-blocks/--kv-memory",
    )
    p.add_argument(
        "--kv-memory", type=_byte_size, default=None, help="KV pool budget, e.g. 512MiB or 1.5GB"
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    # Defaults are SamplingParams' own (vLLM's), so the CLI and the API sample alike.
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--temperature", type=float, default=1.0, help="0 = greedy (default 1.0, as vLLM)"
    )
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--min-tokens", type=int, default=0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--regex", default=None, help="constrain the output to this regex")
    p.add_argument("--json-schema", default=None, help="constrain the output to this JSON schema")


def build_parser(*, with_serve: bool = True) -> argparse.ArgumentParser:
    """The command line's parser. ``with_serve=False`` leaves ``serve`` out: its options
    import the engine's configuration (torch), which ``generate`` on the lean runtime must not
    load (:func:`main` leaves it out when another command is given)."""
    parser = _Parser(prog="deepinfer", description=__doc__)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version('deepinfer')}"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="complete one or more prompts")
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--stream", action="store_true", help="print tokens as they come")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    _add_model_args(gen)
    _add_sampling_args(gen)
    add_runtime_args(gen)

    chat = sub.add_parser("chat", help="interactive chat (reads stdin; empty line or EOF ends)")
    chat.add_argument("--system", default="You are a helpful assistant.")
    _add_model_args(chat)
    _add_sampling_args(chat)

    bench = sub.add_parser("bench", help="throughput and latency on synthetic prompts")
    bench.add_argument("--num-prompts", type=int, default=8)
    bench.add_argument("--input-len", type=int, default=256)
    bench.add_argument("--output-len", type=int, default=32)
    bench.add_argument(
        "--profile",
        default=None,
        metavar="OUT.json",
        help="also time prefill/decode steps over sizes and write a step profile "
        "(input of 'deepinfer-sched calibrate')",
    )
    _add_model_args(bench)

    demo = sub.add_parser("demo", help="the main job: an agent-style workload with a report")
    demo.add_argument("--out", default="out/demo", help="report directory")
    demo.add_argument("--conversations", type=int, default=4)
    demo.add_argument("--turns", type=int, default=3)
    demo.add_argument("--max-tokens", type=int, default=32)
    _add_model_args(demo)
    # The demo reports DSpark's figures, so it drafts with the shipped drafter unless told not to.
    demo.set_defaults(speculative="dspark")
    demo.add_argument(
        "--no-speculative",
        dest="speculative",
        action="store_const",
        const=None,
        help="plain decoding (no DSpark)",
    )
    if with_serve:
        from deepinfer.serve.server import add_serve_parser  # the server keeps its own options

        add_serve_parser(sub)
    return parser


def _make_llm(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from deepinfer import LLM
    from deepinfer.engine.cache_setup import PrefixCacheConfig

    kwargs = {}
    if args.speculative is not None:
        kwargs["speculative"] = args.speculative
    if getattr(args, "num_blocks", None) is not None and getattr(args, "kv_memory", None):
        raise ValueError("--num-blocks and --kv-memory both size the KV pool: give one")
    if (engine_config := _engine_config(args)) is not None:
        kwargs["engine_config"] = engine_config
    if getattr(args, "kv_memory", None) is not None:
        kwargs["kv_memory"] = args.kv_memory
    return LLM(
        args.model,
        dtype=args.dtype,
        device=args.device,
        enable_prefix_caching=not args.no_prefix_cache,
        prefix_cache_config=PrefixCacheConfig(
            directory=args.cache_dir,
            disk_format=args.cache_disk_format,
            key_hash=args.cache_key_hash,
        )
        if args.cache_dir
        or args.cache_disk_format != "segments"
        or args.cache_key_hash != "xxh3_128"
        else None,
        **kwargs,
    )


def _sampling(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from deepinfer.engine import SamplingParams, StructuredOutputsParams

    structured = None
    if args.regex is not None or args.json_schema is not None:
        structured = StructuredOutputsParams(regex=args.regex, json=args.json_schema)
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        seed=args.seed,
        stop=args.stop,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        structured_outputs=structured,
    )


def _choose_runtime(args: argparse.Namespace) -> tuple[str, str]:
    """``(runtime, why)`` for ``generate``: ``"lean"`` or ``"engine"`` (see
    :mod:`deepinfer.lean.cli`; an explicit ``lean`` with an option it does not run was
    refused by :func:`_check_args`)."""
    if args.runtime == "engine":
        return "engine", "--runtime engine"
    unsupported = unsupported_option(args)
    if unsupported is not None:
        return "engine", f"auto: the lean runtime does not run {unsupported}"
    return "lean", f"{args.runtime}: a GGUF model on the CPU, every option supported"


def _cmd_generate(args: argparse.Namespace) -> int:
    runtime, why = _choose_runtime(args)
    if runtime == "lean":
        from deepinfer.lean.llm import LeanLLM
        from deepinfer.lean.weights import UnsupportedModel

        try:
            llm = LeanLLM(args.model, max_model_len=args.max_model_len, threads=args.threads)
        except (UnsupportedModel, KernelsUnavailable) as exc:
            if args.runtime == "lean":
                raise
            why = f"auto: {exc}"
        else:
            return run_lean_generate(args, llm, why, error_line)
    started = time.perf_counter()
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    params = _sampling(args)
    with _make_llm(args) as llm:
        status = 0
        if args.stream:
            # A bad prompt reports its error and the later prompts still run.
            for prompt in args.prompts:
                for out in llm.stream(prompt, params):
                    if out.error:
                        print(f"error: {error_line(out.error)}", file=sys.stderr)
                        status = EXIT_FAILED
                        break
                    print(out.new_text, end="", flush=True)
                else:
                    print()
        else:
            outs = llm.generate(args.prompts, params)
            for prompt, out in zip(args.prompts, outs):
                if out.error:
                    status = 1
                if args.json:
                    print(json.dumps({"prompt": prompt, "text": out.text, "error": out.error}))
                elif out.error:
                    print(f"error: {out.error}", file=sys.stderr)
                else:
                    print(prompt + out.text)
    if args.stats:
        # The engine reports no per-token timings here: tokens over the whole call.
        print_stats("engine", why, 0, 0.0, started)
    return status


def _cmd_chat(args: argparse.Namespace) -> int:
    params = _sampling(args)
    messages = [{"role": "system", "content": args.system}]
    with _make_llm(args) as llm:
        while True:
            try:
                line = input("you> ")
            except EOFError:
                break
            if not line.strip():
                break
            messages.append({"role": "user", "content": line})
            out = llm.chat(messages, params, namespace=b"chat-cli")
            print(f"assistant> {out.text.strip()}")
            messages.append({"role": "assistant", "content": out.text.strip()})
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from deepinfer.engine import SamplingParams

    with _make_llm(args) as llm:
        vocab = llm.loaded.config.vocab_size
        prompts = [
            [(7 + 31 * i + 17 * j) % vocab for j in range(args.input_len)]
            for i in range(args.num_prompts)
        ]
        params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
        generated = sum(len(o.token_ids) for o in outs)
        ttfts = sorted(o.metrics.ttft for o in outs if o.metrics and o.metrics.ttft is not None)
        print(
            json.dumps(
                {
                    "num_prompts": args.num_prompts,
                    "input_len": args.input_len,
                    "output_len": args.output_len,
                    "elapsed_s": round(elapsed, 3),
                    "output_tokens_per_s": round(generated / elapsed, 2),
                    "ttft_p50_s": round(ttfts[len(ttfts) // 2], 3) if ttfts else None,
                },
                indent=2,
            )
        )
        if args.profile:
            from deepinfer.profile import profile_engine, write_profile

            write_profile(
                profile_engine(llm.engine, model_name=str(args.model or "")), args.profile
            )
            print(f"step profile -> {args.profile}", file=sys.stderr)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import tempfile

    from deepinfer.demo import DemoConfig, run_demo

    # Fail before the workload runs, not after, when the report cannot be written.
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryFile(dir=args.out):
        pass
    run_demo(
        DemoConfig(
            out_dir=args.out,
            num_conversations=args.conversations,
            num_turns=args.turns,
            max_tokens=args.max_tokens,
        ),
        lambda: _make_llm(args),
    )
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from deepinfer.serve.server import cmd_serve

    return cmd_serve(args)


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad arguments before anything loads (usage errors, exit 2)."""
    if getattr(args, "max_tokens", 1) < 1:
        parser.error(f"argument --max-tokens: must be >= 1, got {args.max_tokens}")
    lean = False
    if getattr(args, "runtime", "engine") != "engine":
        unsupported = unsupported_option(args)
        if unsupported is not None and args.runtime == "lean":
            parser.error(f"argument --runtime lean: it does not run {unsupported}")
        lean = unsupported is None
    if getattr(args, "threads", None) is not None and args.threads < 1:
        parser.error(f"argument --threads: must be >= 1, got {args.threads}")
    if hasattr(args, "temperature"):
        try:
            # The lean runtime's own checks: the engine's would import torch.
            lean_sampling(args) if lean else _sampling(args)
        except (ValueError, TypeError) as exc:
            parser.error(f"invalid sampling argument: {exc}")
    for name in ("num_prompts", "input_len", "output_len", "conversations", "turns"):
        if getattr(args, name, 1) < 1:
            parser.error(f"argument --{name.replace('_', '-')}: must be >= 1")
    model = getattr(args, "model", None)
    if model is not None and not os.path.exists(model):
        parser.error(f"argument --model: {model!r} does not exist")
    device = getattr(args, "device", "cpu")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error(f"argument --device: {device!r} asked for, but CUDA is not available")
    elif device != "cpu":
        parser.error(f"argument --device: expected 'cpu' or 'cuda[:N]', got {device!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``deepinfer``: returns the exit code (0 ok, 1 failed, 2 usage).

    Errors are one line on stderr; ``DEEPINFER_TRACEBACK=1`` re-raises them with a traceback.
    """
    words = sys.argv[1:] if argv is None else list(argv)
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(with_serve=command in (None, "serve"))
    args = parser.parse_args(argv)
    commands = {
        "generate": _cmd_generate,
        "chat": _cmd_chat,
        "bench": _cmd_bench,
        "demo": _cmd_demo,
        "serve": _cmd_serve,
    }
    _check_args(parser, args)
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        print("deepinfer: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if os.environ.get("DEEPINFER_TRACEBACK"):
            raise
        print(f"deepinfer {args.command}: error: {error_line(exc)}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
