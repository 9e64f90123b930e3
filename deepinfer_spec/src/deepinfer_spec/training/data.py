"""Token-sequence sources for drafter training: batching, JSONL files, self-generated data."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from deepinfer_spec.adapter import ScoringTarget


def batches(
    data: Iterable[Sequence[int] | torch.Tensor],
    batch_size: int,
    max_len: int,
    min_len: int,
    vocab_size: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Right-padded ``(input_ids [B, T], lengths [B])`` batches, epoch after epoch.

    Sequences are cut to ``max_len``; shorter than ``min_len`` are skipped. A re-iterable
    ``data`` (a list, a dataset) is cycled; a one-shot iterator ends the stream when exhausted.
    """
    while True:
        it = iter(data)
        one_shot = it is data
        buf: list[list[int]] = []
        produced = False
        for seq in it:
            ids = seq.tolist() if isinstance(seq, torch.Tensor) else list(seq)
            ids = [int(t) for t in ids[:max_len]]
            if len(ids) < min_len:
                continue
            if any(not 0 <= t < vocab_size for t in ids):
                raise ValueError(f"data: token ids must lie in [0, {vocab_size})")
            buf.append(ids)
            if len(buf) == batch_size:
                produced = True
                yield _pad(buf)
                buf = []
        if buf:
            produced = True
            yield _pad(buf)
        if one_shot or not produced:
            return


def _pad(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.int64)
    return ids, torch.tensor([len(s) for s in seqs], dtype=torch.int64)


def read_jsonl(path: str | os.PathLike[str]) -> list[list[int]]:
    """One sequence per line: a JSON list of ints, or an object with ``input_ids`` or ``ids``."""
    out = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: invalid JSON ({exc})") from exc
        if isinstance(item, dict):
            item = item.get("input_ids", item.get("ids"))
        if not isinstance(item, list) or not all(isinstance(t, int) for t in item):
            raise ValueError(f"{path}:{lineno}: expected a list of token ids")
        out.append(item)
    return out


@torch.no_grad()
def sample_from_target(
    target: ScoringTarget,
    num_sequences: int,
    length: int,
    *,
    temperature: float = 1.0,
    batch_size: int = 64,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """Self-distillation data: sequences sampled from the target (uniform first token).

    Uses full recomputation through ``score``; meant for small targets and tests.
    """
    if num_sequences < 1 or length < 2 or temperature <= 0:
        raise ValueError("num_sequences >= 1, length >= 2 and temperature > 0 are required")
    out: list[list[int]] = []
    while len(out) < num_sequences:
        b = min(batch_size, num_sequences - len(out))
        ids = torch.randint(0, target.vocab_size, (b, 1), generator=generator).to(device)
        for _ in range(length - 1):
            logits = target.score(ids, [0]).logits[:, -1].float()
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(device)
            ids = torch.cat((ids, nxt), dim=1)
        out.extend(ids.tolist())
    return out


def frequent_tokens(
    data: Iterable[Sequence[int] | torch.Tensor],
    vocab_size: int,
    size: int,
    *,
    always: Sequence[int] = (),
) -> torch.Tensor:
    """The ``size`` most frequent token ids of ``data``: a draft vocabulary for
    :meth:`~deepinfer_spec.DSparkDrafter.restrict_vocab`.

    ``always`` ids (end-of-turn and other special tokens a corpus may rarely show) come first;
    the rest follow by descending count, ties by ascending id. Fewer than ``size`` ids are
    returned only when ``vocab_size`` is smaller.
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size: expected a positive int, got {size!r}")
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq in data:
        ids = torch.as_tensor(seq, dtype=torch.int64).reshape(-1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise ValueError(f"data: token ids must lie in [0, {vocab_size})")
        counts += torch.bincount(ids, minlength=vocab_size)
    first = list(dict.fromkeys(int(t) for t in always))
    if any(not 0 <= t < vocab_size for t in first):
        raise ValueError(f"always: token ids must lie in [0, {vocab_size})")
    # Stable sort on -count keeps ascending ids among equal counts.
    order = torch.sort(-counts, stable=True).indices.tolist()
    chosen = set(first)
    rest = [t for t in order if t not in chosen]
    return torch.tensor((first + rest)[: min(size, vocab_size)], dtype=torch.int64)
