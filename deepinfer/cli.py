"""The `deepinfer` command line: `generate`, `chat`, `bench`, `demo`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-prefix-cache", action="store_true", help="disable the prefix cache")
    p.add_argument("--cache-dir", default=None, help="prefix cache directory (disk tier)")
    p.add_argument("--speculative", default=None, help="'dspark' or a drafter checkpoint dir")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinfer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete one or more prompts")
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--stream", action="store_true", help="print tokens as they come")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    _add_model_args(gen)
    _add_sampling_args(gen)

    chat = sub.add_parser("chat", help="interactive chat (reads stdin; empty line or EOF ends)")
    chat.add_argument("--system", default="You are a helpful assistant.")
    _add_model_args(chat)
    _add_sampling_args(chat)

    bench = sub.add_parser("bench", help="throughput and latency on synthetic prompts")
    bench.add_argument("--num-prompts", type=int, default=8)
    bench.add_argument("--input-len", type=int, default=256)
    bench.add_argument("--output-len", type=int, default=32)
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
    from deepinfer.serve.server import add_serve_parser  # the server keeps its own options

    add_serve_parser(sub)
    return parser


def _make_llm(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from deepinfer import LLM
    from deepinfer.engine.cache_setup import PrefixCacheConfig

    kwargs = {}
    if args.speculative is not None:
        kwargs["speculative"] = args.speculative
    return LLM(
        args.model,
        dtype=args.dtype,
        device=args.device,
        enable_prefix_caching=not args.no_prefix_cache,
        prefix_cache_config=PrefixCacheConfig(directory=args.cache_dir) if args.cache_dir else None,
        **kwargs,
    )


def _sampling(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from deepinfer.engine import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    params = _sampling(args)
    with _make_llm(args) as llm:
        if args.stream:
            for prompt in args.prompts:
                for out in llm.stream(prompt, params):
                    if out.error:
                        print(f"error: {out.error}", file=sys.stderr)
                        return 1
                    print(out.new_text, end="", flush=True)
                print()
            return 0
        status = 0
        for prompt, out in zip(args.prompts, llm.generate(args.prompts, params)):
            if out.error:
                status = 1
            if args.json:
                print(json.dumps({"prompt": prompt, "text": out.text, "error": out.error}))
            elif out.error:
                print(f"error: {out.error}", file=sys.stderr)
            else:
                print(prompt + out.text)
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
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from deepinfer.demo import DemoConfig, run_demo

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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {
        "generate": _cmd_generate,
        "chat": _cmd_chat,
        "bench": _cmd_bench,
        "demo": _cmd_demo,
        "serve": _cmd_serve,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
