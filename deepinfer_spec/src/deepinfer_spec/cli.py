"""``deepinfer-spec``: train and evaluate DSpark drafters from the command line.

The target model comes from a factory, ``--target module:function``, returning a
``TargetAdapter`` (or a ``ScoringTarget``, which evaluation wraps in ``RecomputeTarget``);
``--target-kwargs`` passes a JSON object to it. Data is a JSONL file of token-id lists
(``--data``) or sequences sampled from the target itself (``--synthetic N``).

Examples::

    deepinfer-spec train --target mypkg.models:load_target --data train.jsonl \\
        --target-layers 1,3 --steps 2000 --out drafter/
    deepinfer-spec eval --target mypkg.models:load_target --checkpoint drafter/ --data eval.jsonl
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any, NoReturn

import torch

from deepinfer_spec.adapter import ScoringTarget
from deepinfer_spec.config import DSparkConfig
from deepinfer_spec.training import (
    TrainConfig,
    evaluate,
    load_drafter,
    read_jsonl,
    sample_from_target,
    train_drafter,
)

EXIT_FAILED, EXIT_USAGE = 1, 2


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (``deepinfer-spec train: error: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


class UsageError(ValueError):
    """A command-line argument is wrong (exit code 2)."""


def load_target(spec: str, kwargs_json: str | None) -> ScoringTarget:
    """Import ``module:function`` and call it with the JSON keyword arguments."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--target: expected 'module:function', got {spec!r}")
    try:
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
    except json.JSONDecodeError as exc:
        raise UsageError(f"--target-kwargs: not valid JSON ({exc})") from None
    if not isinstance(kwargs, dict):
        raise UsageError("--target-kwargs: expected a JSON object")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--target: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"--target: {module_name!r} has no callable {attr!r}")
    target = factory(**kwargs)
    if not isinstance(target, ScoringTarget):
        raise TypeError(f"--target: {spec} returned {type(target).__name__}, not a TargetAdapter")
    return target


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from exc


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="deepinfer-spec", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("--target", required=True, help="module:function returning the target")
    common.add_argument("--target-kwargs", default=None, help="JSON object for the factory")
    common.add_argument("--data", default=None, help="JSONL file of token-id lists")
    common.add_argument("--synthetic", type=int, default=0, help="sample N sequences instead")
    common.add_argument("--seq-len", type=int, default=64, help="length of synthetic sequences")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--device", default="cpu")
    common.add_argument("--eval-prompts", type=int, default=16)
    common.add_argument("--prompt-len", type=int, default=16)
    common.add_argument("--max-new-tokens", type=int, default=32)
    common.add_argument("--temperature", type=float, default=1.0)

    t = sub.add_parser("train", parents=[common], help="train a drafter")
    t.add_argument("--out", required=True, help="checkpoint directory")
    t.add_argument("--resume", action="store_true", help="resume from --out")
    t.add_argument("--target-layers", type=_int_tuple, default=None)
    t.add_argument("--gamma", type=int, default=5)
    t.add_argument("--window", type=int, default=128)
    t.add_argument("--num-layers", type=int, default=1)
    t.add_argument("--num-heads", type=int, default=4)
    t.add_argument("--markov-rank", type=int, default=256)
    t.add_argument("--sequential-head", choices=("markov", "rnn"), default="markov")
    t.add_argument("--init-from-target-layers", type=_int_tuple, default=None)
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--anchors-per-sequence", type=int, default=4)
    t.add_argument("--max-seq-len", type=int, default=512)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup-steps", type=int, default=20)
    t.add_argument("--checkpoint-every", type=int, default=0)
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--no-eval", action="store_true", help="skip evaluation after training")

    e = sub.add_parser("eval", parents=[common], help="measure acceptance of a checkpoint")
    e.add_argument("--checkpoint", required=True)
    return p


def _sequences(args: argparse.Namespace, target: ScoringTarget, extra: int) -> list[list[int]]:
    if args.data:
        return read_jsonl(args.data)
    if args.synthetic < 1:
        raise UsageError("give --data FILE or --synthetic N")
    gen = torch.Generator().manual_seed(args.seed)
    return sample_from_target(
        target, args.synthetic + extra, args.seq_len, generator=gen, device=args.device
    )


def _split(args: argparse.Namespace, seqs: list[list[int]]) -> tuple[list[list[int]], list[Any]]:
    n_eval = min(args.eval_prompts, max(1, len(seqs) // 5))
    prompts = [s[: args.prompt_len] for s in seqs[-n_eval:]]
    return seqs[:-n_eval] or seqs, prompts


def _version() -> str:
    try:
        return metadata.version("deepinfer-spec")
    except metadata.PackageNotFoundError:
        return "unknown"


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad numbers before the target loads (usage errors, exit 2)."""
    if not math.isfinite(args.temperature) or args.temperature <= 0:
        parser.error(f"argument --temperature: must be a finite number > 0, got {args.temperature}")
    positive = ["seq_len", "eval_prompts", "prompt_len", "max_new_tokens"]
    if args.command == "train":
        positive += ["gamma", "window", "num_layers", "num_heads", "markov_rank", "steps"]
        positive += ["batch_size", "anchors_per_sequence", "max_seq_len"]
        if not math.isfinite(args.lr) or args.lr <= 0:
            parser.error(f"argument --lr: must be a finite number > 0, got {args.lr}")
    for name in positive:
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            parser.error(f"argument {flag}: must be >= 1, got {getattr(args, name)}")
    if args.synthetic < 0:
        parser.error(f"argument --synthetic: must be >= 0, got {args.synthetic}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"argument --device: {args.device!r} asked for, but CUDA is not available")
    if args.data is not None and not os.path.isfile(args.data):
        parser.error(f"argument --data: {args.data!r} is not a file")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``deepinfer-spec``: 0 ok, 1 failed, 2 usage; errors are one line on
    stderr (``DEEPINFER_TRACEBACK=1`` re-raises them with a traceback)."""
    parser = _parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("deepinfer-spec: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("DEEPINFER_TRACEBACK"):
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        if not isinstance(exc, (ValueError, TypeError, OSError)):
            message = f"{type(exc).__name__}: {message}"
        print(f"deepinfer-spec {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED


def _run(args: argparse.Namespace) -> int:
    target = load_target(args.target, args.target_kwargs)
    seqs = _sequences(args, target, extra=args.eval_prompts)
    train_seqs, prompts = _split(args, seqs)
    if args.command == "eval":
        drafter = load_drafter(args.checkpoint, target, args.device)
    else:
        train = TrainConfig(
            steps=args.steps,
            batch_size=args.batch_size,
            anchors_per_sequence=args.anchors_per_sequence,
            max_seq_len=args.max_seq_len,
            lr=args.lr,
            warmup_steps=args.warmup_steps,
            seed=args.seed,
            checkpoint_every=args.checkpoint_every,
            out_dir=args.out,
            init_from_target_layers=args.init_from_target_layers,
            progress=not args.no_progress,
            device=args.device,
        )
        config = None
        if not args.resume:
            layers = args.target_layers or tuple(range(target.num_layers))
            config = DSparkConfig(
                target_layer_ids=layers,
                gamma=args.gamma,
                window=args.window,
                num_layers=args.num_layers,
                num_heads=args.num_heads,
                markov_rank=args.markov_rank,
                sequential_head=args.sequential_head,
            )
        result = train_drafter(
            target, train_seqs, config, train, resume_from=args.out if args.resume else None
        )
        drafter = result.drafter
        if result.history:
            last = result.history[-1]
            print(
                f"step {result.step}: loss {last['loss']:.4f} tv {last['tv']:.4f} "
                f"acceptance {last['acceptance']:.3f}; checkpoint in {args.out}"
            )
        if args.no_eval:
            return 0
    evaluate(
        drafter,
        target,
        prompts,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        verbose=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
