"""Train (or resume) the DSpark drafter shipped for the embedded SmolLM2-135M-Instruct.

The corpus is offline and on every machine: the Python standard library's source and the
documentation shipped with it (``pydoc_data``, module docstrings). The target is frozen; the
drafter is trained with ``deepinfer_spec.training.train_drafter`` for a bounded wall-clock time
and resumes from ``--work-dir`` when run again. ``--export`` writes the weights in bf16 (the
embedding and LM head are shared with the target and never saved) into ``deepinfer/data/``
(``--export-dir`` elsewhere). ``--init-from DIR`` starts from a checkpoint, e.g. the shipped one.

    TRITON_INTERPRET=1 nohup .venv/bin/python recipes/dspark_smollm2/train_drafter.py --minutes 20 \
        --work-dir /tmp/dspark-smollm2 --export > /tmp/train_drafter.log 2>&1 &
    .venv/bin/python recipes/dspark_smollm2/train_drafter.py --eval-only --work-dir deepinfer/data/dspark-smollm2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from deepinfer.models import KVPool, LoadedModel, load_model
from deepinfer.models.spec_adapter import LlamaTargetAdapter
from deepinfer_spec import DSparkConfig
from deepinfer_spec.training import (
    TrainConfig,
    evaluate,
    frequent_tokens,
    load_drafter,
    save_drafter,
    train_drafter,
)
from deepinfer_spec.training.checkpoint import WEIGHTS
from deepinfer_spec.training.loss import LossWeights

REPO = Path(__file__).resolve().parents[2]
EXPORT_DIR = REPO / "deepinfer" / "data" / "dspark-smollm2"


def corpus_files(held_out: bool) -> list[Path]:
    """Stdlib ``.py`` files (tests excluded: they are mostly boilerplate); a stable 1/40 of the
    files (by path hash) is held out for evaluation."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or "/test" in rel or rel.startswith("test"):
            continue
        bucket = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % 40
        if (bucket == 0) == held_out:
            out.append(path)
    return out


def token_chunks(
    tokenizer: object,
    files: list[Path],
    seq_len: int,
    seed: int,
    deadline: float,
    shuffle_buffer: int = 8192,
) -> Iterator[list[int]]:
    """``seq_len``-token chunks of the files, tokenized lazily, in shuffled order; stops at
    ``deadline`` (``time.monotonic``) so training ends on time and checkpoints.

    Files are read in a shuffled order and their chunks pass through a ``shuffle_buffer``-chunk
    reservoir, each yield a random pick from it. Without it one large file fills hundreds of
    consecutive steps (``pydoc_data/topics.py``, 1340 chunks, is 670 steps at batch 4 with
    reuse 2): the drafter adapts to that file and forgets the rest, and its training
    acceptance measures the file, not the corpus."""
    rng = random.Random(seed)
    order = list(files)
    rng.shuffle(order)
    buffer: list[list[int]] = []

    def pick() -> list[int]:
        i = rng.randrange(len(buffer))
        buffer[i], buffer[-1] = buffer[-1], buffer[i]
        return buffer.pop()

    for path in order:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = tokenizer.encode(text)  # type: ignore[attr-defined]
        for start in range(0, len(ids) - seq_len // 2, seq_len):
            buffer.append(ids[start : start + seq_len])
            if len(buffer) >= shuffle_buffer:
                if time.monotonic() > deadline:
                    return
                yield pick()
    while buffer and time.monotonic() <= deadline:
        yield pick()


def distill_records(path: Path, held_out: bool) -> list[tuple[list[int], int, str]]:
    """``(input_ids, prompt_len, kind)`` of the records of a ``distill_corpus.py`` JSONL file:
    every 20th record (by line number) is held out for evaluation (``held_out=True`` returns
    those), the others are for training."""
    records = []
    for lineno, line in enumerate(path.read_text().splitlines()):
        if (lineno % 20 == 19) != held_out:
            continue
        item = json.loads(line)
        records.append((item["input_ids"], int(item["prompt_len"]), str(item["kind"])))
    return records


def distill_chunks(path: Path, seq_len: int, seed: int, deadline: float) -> Iterator[list[int]]:
    """Windows of the training records of ``path`` (:func:`distill_records`), epoch after epoch
    in a fresh shuffled order, until ``deadline``.

    Each window holds ``seq_len`` tokens ending at a random point of the response, so anchors
    fall mostly on text the target wrote and the window still carries some prompt to attend to."""
    records = [
        (ids, prompt_len)
        for ids, prompt_len, _ in distill_records(path, held_out=False)
        if len(ids) - prompt_len >= 8
    ]
    if not records:
        raise ValueError(f"{path}: no usable records")
    rng = random.Random(seed)
    while True:
        order = list(range(len(records)))
        rng.shuffle(order)
        for i in order:
            if time.monotonic() > deadline:
                return
            ids, prompt_len = records[i]
            end = rng.randint(min(len(ids), prompt_len + seq_len // 2), len(ids))
            yield ids[max(0, end - seq_len) : end]


def mixed(
    first: Iterator[list[int]], second: Iterator[list[int]], share: float, seed: int
) -> Iterator[list[int]]:
    """Items of ``second`` with probability ``share``, else of ``first``; ends with either."""
    rng = random.Random(seed)
    while True:
        source = second if rng.random() < share else first
        item = next(source, None)
        if item is None:
            return
        yield item


class ReusingTarget:
    """The frozen target, remembering its last ``score`` so that a batch repeated ``--reuse``
    times (fresh random anchors each time) costs one target forward: on a CPU the target
    forward dominates a training step."""

    def __init__(self, target: LlamaTargetAdapter) -> None:
        self.target = target
        self.hidden_size, self.vocab_size = target.hidden_size, target.vocab_size
        self.num_layers = target.num_layers
        self._last: tuple[torch.Tensor, tuple[int, ...], object] | None = None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(hidden)

    def layer_state_dict(self, layer_id: int) -> dict[str, torch.Tensor]:
        return self.target.layer_state_dict(layer_id)

    def score(self, input_ids: torch.Tensor, layer_ids: object) -> object:
        key = tuple(layer_ids)  # type: ignore[call-overload]
        last = self._last
        if last is not None and last[1] == key and torch.equal(last[0], input_ids):
            return last[2]
        out = self.target.score(input_ids, key)
        self._last = (input_ids.clone(), key, out)
        return out


def repeat_batches(chunks: Iterator[list[int]], batch_size: int, reuse: int) -> Iterator[list[int]]:
    """Yield each group of ``batch_size`` sequences ``reuse`` times in a row."""
    group: list[list[int]] = []
    for chunk in chunks:
        group.append(chunk)
        if len(group) == batch_size:
            for _ in range(reuse):
                yield from group
            group = []


def eval_prompts(tokenizer: object, count: int, length: int) -> list[list[int]]:
    prompts = []
    for path in corpus_files(held_out=True):
        ids = tokenizer.encode(path.read_text(encoding="utf-8"))  # type: ignore[attr-defined]
        if len(ids) > length * 2:
            prompts.append(ids[length // 2 : length // 2 + length])
        if len(prompts) == count:
            break
    return prompts


def draft_vocabulary(tokenizer: object, size: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of the training corpus (stdlib source, docstrings and
    ``pydoc_data``'s English reference text), end-of-turn and BOS ids first."""
    tok = tokenizer
    texts = (path.read_text(encoding="utf-8", errors="replace") for path in corpus_files(False))
    always = [*tok.eos_token_ids, tok.bos_token_id]  # type: ignore[attr-defined]
    return frequent_tokens(
        (tok.encode(text) for text in texts),  # type: ignore[attr-defined]
        tok.vocab_size,  # type: ignore[attr-defined]
        size,
        always=[t for t in always if t is not None],
    )


def export(loaded: LoadedModel, work_dir: Path, out_dir: Path, draft_vocab: int | None) -> None:
    """Write the drafter into ``out_dir``: weights in bf16 (the feature statistics stay fp32),
    restricted to a ``draft_vocab``-token shortlist when given, plus config and STS files."""
    target = LlamaTargetAdapter(loaded.model, KVPool.for_model(loaded.config, num_blocks=8))
    drafter = load_drafter(work_dir, target)
    if draft_vocab is not None:
        drafter = drafter.restrict_vocab(draft_vocabulary(loaded.tokenizer, draft_vocab))
    for param in drafter.parameters():
        param.data = param.data.to(torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_drafter(drafter, out_dir)
    evaluated = work_dir / "eval.json"
    if evaluated.exists():  # STS temperatures fitted by the evaluation, per decoding mode
        data = json.loads(evaluated.read_text())
        (out_dir / "eval.json").write_text(evaluated.read_text())
        sts = {
            mode: data["eval"][key]["temperatures"]
            for mode, key in (("greedy", "T=0.0"), ("sampling", "T=1.0"))
            if key in data["eval"]
        }
        (out_dir / "sts.json").write_text(json.dumps(sts, indent=1))
    size = (out_dir / WEIGHTS).stat().st_size
    print(f"exported {out_dir} ({size / 2**20:.1f} MiB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/dspark-smollm2"))
    p.add_argument("--minutes", type=float, default=20.0, help="wall-clock training budget")
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--anchors", type=int, default=24, help="draft blocks per sequence per step")
    p.add_argument("--reuse", type=int, default=4, help="updates per target forward")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--markov-rank", type=int, default=32)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--layers", default="20,29", help="target layers feeding the context")
    p.add_argument(
        "--init-layer",
        type=int,
        default=None,
        help="copy this target layer into the backbone (default: random init, which trains "
        "faster: a copied late layer starts with huge residual activations)",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start a new run from this drafter checkpoint (e.g. deepinfer/data/dspark-smollm2)",
    )
    p.add_argument("--ce-weight", type=float, default=0.1, help="loss weight of CE on the data")
    p.add_argument("--tv-weight", type=float, default=0.9, help="loss weight of TV to the target")
    p.add_argument("--bce-weight", type=float, default=1.0, help="confidence-head BCE weight")
    p.add_argument(
        "--distill-weight", type=float, default=0.0, help="soft-label CE to the target's p_t"
    )
    p.add_argument(
        "--distill",
        type=Path,
        default=None,
        help="self-distillation JSONL from distill_corpus.py, mixed into the stdlib chunks",
    )
    p.add_argument(
        "--distill-share", type=float, default=0.75, help="fraction of chunks from --distill"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-prompts", type=int, default=4)
    p.add_argument("--eval-tokens", type=int, default=32)
    p.add_argument("--eval-only", action="store_true")
    p.add_argument(
        "--export", action="store_true", help="write bf16 weights to --export-dir after training"
    )
    p.add_argument(
        "--export-dir",
        type=Path,
        default=EXPORT_DIR,
        help=f"where --export / --export-only write the checkpoint (default: {EXPORT_DIR})",
    )
    p.add_argument("--export-only", action="store_true", help="export --work-dir and exit")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        help="export restricted to the N most frequent corpus tokens (default: all)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.export_only:
        export(load_model(), args.work_dir, args.export_dir, args.draft_vocab)
        return

    loaded = load_model()
    cfg = loaded.config
    target = LlamaTargetAdapter(loaded.model, KVPool.for_model(cfg, num_blocks=256))
    prompts = eval_prompts(loaded.tokenizer, args.eval_prompts, 96)

    def report(tag: str, drafter: object) -> dict[str, object]:
        t0 = time.monotonic()
        out = {}
        for temp in (0.0, 1.0):
            rep = evaluate(
                drafter,
                target,
                prompts,
                max_new_tokens=args.eval_tokens,  # type: ignore[arg-type]
                temperature=temp,
            )
            print(f"[{tag}] temperature {temp}\n{rep.format()}", flush=True)
            out[f"T={temp}"] = {
                "tau": rep.tau,
                "acceptance": rep.acceptance,
                "ece_before": rep.ece_before,
                "ece_after": rep.ece_after,
                "temperatures": rep.temperatures,
                "steps": rep.steps,
            }
        print(f"[{tag}] eval took {time.monotonic() - t0:.0f}s", flush=True)
        return out

    if args.eval_only:
        drafter = load_drafter(args.work_dir, target).float()
        print(json.dumps(report("eval", drafter), indent=1))
        return

    resume = (args.work_dir / "trainer_state.json").exists()
    config = DSparkConfig(
        target_layer_ids=tuple(int(x) for x in args.layers.split(",")),
        gamma=5,
        window=args.window,
        num_layers=1,
        markov_rank=args.markov_rank,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
    )
    start_step = 0
    if resume:
        start_step = json.loads((args.work_dir / "trainer_state.json").read_text())["step"]
    deadline = time.monotonic() + args.minutes * 60
    chunks = token_chunks(
        loaded.tokenizer, corpus_files(held_out=False), args.seq_len, start_step, deadline
    )
    if args.distill is not None:
        own = distill_chunks(args.distill, args.seq_len, start_step, deadline)
        chunks = mixed(chunks, own, args.distill_share, start_step)
    data = repeat_batches(chunks, args.batch_size, args.reuse)
    train = TrainConfig(
        steps=args.max_steps,
        batch_size=args.batch_size,
        anchors_per_sequence=args.anchors,
        max_seq_len=args.seq_len,
        lr=args.lr,
        warmup_steps=10,
        log_every=5,
        checkpoint_every=10,
        out_dir=str(args.work_dir),
        init_from_target_layers=(
            None if resume or args.init_from or args.init_layer is None else (args.init_layer,)
        ),
        progress=True,
        loss_weights=LossWeights(
            ce=args.ce_weight,
            tv=args.tv_weight,
            bce=args.bce_weight,
            distill=args.distill_weight,
        ),
    )
    t0 = time.monotonic()
    start = None
    if args.init_from is not None and not resume:
        start = load_drafter(args.init_from, target).float()
    result = train_drafter(
        ReusingTarget(target),  # type: ignore[arg-type]
        data,
        None if resume or start is not None else config,
        train,
        drafter=start,
        resume_from=args.work_dir if resume else None,
    )
    print(f"trained to step {result.step} in {time.monotonic() - t0:.0f}s", flush=True)
    for entry in result.history[-5:]:
        print(entry)
    metrics = report("after", result.drafter)
    (args.work_dir / "eval.json").write_text(
        json.dumps({"step": result.step, "eval": metrics}, indent=1)
    )
    if args.export:
        export(loaded, args.work_dir, args.export_dir, args.draft_vocab)


if __name__ == "__main__":
    main()
