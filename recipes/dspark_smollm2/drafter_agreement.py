"""How often the DSpark drafter's top-1 draft equals the target's top-1, and how a few minutes of
training with given loss weights move it: a quick probe of a training recipe on the CPU.

Teacher forcing on the first 300 tokens of one stdlib file (``json/decoder.py`` by default; it
may be part of the training corpus, so this probes fit, not generalisation): for every second
anchor ``n`` from 130 on, the drafter sees the target's features
before ``n`` and the true tokens ``x_n .. x_{n+G-1}``, and its argmax at block position ``k`` is
compared with the target's argmax after ``x_{n+k-1}``. Then (``--minutes > 0``) the same drafter
trains for that long on the stdlib corpus with the given loss weights, and the probe runs again.
``--distill FILE`` also probes the held-out responses of a ``distill_corpus.py`` file: the text
the target itself writes, which is what the drafter meets in the engine.

A drafter with a draft vocabulary predicts draft indices; they are mapped to token ids before
the comparison (before session 7 they were not, and a restricted drafter scored ~0).

    .venv/bin/python recipes/dspark_smollm2/drafter_agreement.py --minutes 4 --ce-weight 1.0
    .venv/bin/python recipes/dspark_smollm2/drafter_agreement.py --minutes 4 --ce-weight 0.1
    .venv/bin/python recipes/dspark_smollm2/drafter_agreement.py --minutes 0 --distill /tmp/distill.jsonl
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_drafter import (
    EXPORT_DIR,
    ReusingTarget,
    corpus_files,
    distill_records,
    repeat_batches,
    token_chunks,
)

from deepinfer.models import KVPool, load_model
from deepinfer.models.spec_adapter import LlamaTargetAdapter
from deepinfer_spec import DSparkDrafter
from deepinfer_spec.training import TrainConfig, load_drafter, train_drafter
from deepinfer_spec.training.loss import LossWeights


@torch.no_grad()
def agreement_hits(
    drafter: DSparkDrafter, target: LlamaTargetAdapter, ids: torch.Tensor, first: int, stride: int
) -> tuple[list[int], int]:
    """Per block position, how many anchors ``first, first + stride, ...`` of ``ids [1, T]`` have
    the drafter's argmax equal to the target's; and the number of anchors."""
    cfg = drafter.config
    drafter.eval()
    out = target.score(ids, list(cfg.target_layer_ids))
    context = drafter.project_context(out.features)
    want = out.logits[0].argmax(-1)  # want[t]: the target's prediction after token t
    hits, anchors = [0] * cfg.gamma, 0
    for n in range(max(1, first), ids.shape[1] - cfg.gamma - 1, stride):
        width = min(cfg.window, n)
        valid = torch.ones(1, width, dtype=torch.bool)
        hidden = drafter.backbone(ids[:, n], context[:, n - width : n], valid)
        logits, _ = drafter.teacher_forced(hidden, ids[:, n : n + cfg.gamma])
        got = drafter.draft_token_ids(logits[0].argmax(-1))
        for k in range(cfg.gamma):
            hits[k] += int(got[k] == want[n + k])
        anchors += 1
    return hits, anchors


def agreement(drafter: DSparkDrafter, target: LlamaTargetAdapter, ids: torch.Tensor) -> list[float]:
    """Per block position, the fraction of anchors from 130 on (every second) where the
    drafter's argmax is the target's."""
    hits, anchors = agreement_hits(drafter, target, ids, 130, 2)
    return [h / max(1, anchors) for h in hits]


def distill_agreement(
    drafter: DSparkDrafter, target: LlamaTargetAdapter, path: Path, limit: int
) -> dict[str, list[float]]:
    """:func:`agreement` on the responses of up to ``limit`` held-out records of a
    ``distill_corpus.py`` file (every anchor inside the response), per record kind."""
    totals: dict[str, tuple[list[int], int]] = {}
    for ids, start, kind in distill_records(path, held_out=True):
        if len(ids) - start < 16:
            continue
        hits, anchors = agreement_hits(drafter, target, torch.tensor([ids]), start, 1)
        old_hits, old_anchors = totals.get(kind, ([0] * len(hits), 0))
        totals[kind] = ([a + b for a, b in zip(old_hits, hits)], old_anchors + anchors)
        limit -= 1
        if limit == 0:
            break
    return {kind: [h / max(1, n) for h in hits] for kind, (hits, n) in totals.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--drafter", type=Path, default=EXPORT_DIR, help="checkpoint to start from")
    p.add_argument("--probe-file", default="json/decoder.py", help="stdlib file to probe on")
    p.add_argument("--minutes", type=float, default=4.0)
    p.add_argument("--ce-weight", type=float, default=1.0)
    p.add_argument("--tv-weight", type=float, default=0.9)
    p.add_argument("--bce-weight", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--distill",
        type=Path,
        default=None,
        help="also probe the held-out responses of this distill_corpus.py file",
    )
    p.add_argument("--distill-records", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loaded = load_model()
    tok = loaded.tokenizer
    target = LlamaTargetAdapter(loaded.model, KVPool.for_model(loaded.config, num_blocks=64))
    drafter = load_drafter(args.drafter, target).float()
    text = Path(sysconfig.get_paths()["stdlib"], args.probe_file).read_text(encoding="utf-8")
    ids = torch.tensor([tok.encode(text)[:300]])
    before = agreement(drafter, target, ids)
    print("before:", [round(a, 3) for a in before], flush=True)
    if args.distill is not None:
        found = distill_agreement(drafter, target, args.distill, args.distill_records)
        for kind, values in found.items():
            print(f"held-out {kind} responses:", [round(a, 3) for a in values], flush=True)
    if args.minutes <= 0:
        return
    deadline = time.monotonic() + args.minutes * 60
    data = repeat_batches(
        token_chunks(tok, corpus_files(held_out=False), 128, 7, deadline), batch_size=4, reuse=2
    )
    train = TrainConfig(
        steps=100_000,
        batch_size=4,
        anchors_per_sequence=24,
        max_seq_len=128,
        lr=args.lr,
        warmup_steps=5,
        log_every=10,
        progress=False,
        loss_weights=LossWeights(ce=args.ce_weight, tv=args.tv_weight, bce=args.bce_weight),
    )
    start = time.monotonic()
    result = train_drafter(ReusingTarget(target), data, None, train, drafter=drafter)  # type: ignore[arg-type]
    after = agreement(result.drafter, target, ids)
    print(
        f"trained {result.step} steps in {time.monotonic() - start:.0f} s with "
        f"ce {args.ce_weight}, tv {args.tv_weight}, bce {args.bce_weight}, lr {args.lr}"
    )
    print("after: ", [round(a, 3) for a in after])


if __name__ == "__main__":
    main()
