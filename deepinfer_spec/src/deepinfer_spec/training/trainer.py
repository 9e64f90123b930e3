"""``train_drafter``: fit a DSpark drafter to a frozen target."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from deepinfer_spec.adapter import ScoringTarget
from deepinfer_spec.config import DSparkConfig
from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.training.checkpoint import (
    load_drafter,
    load_training_state,
    save_drafter,
    save_training_state,
)
from deepinfer_spec.training.data import batches
from deepinfer_spec.training.loss import LossWeights, dspark_loss, sample_anchors
from deepinfer_spec.training.teacher import DraftVocabTeacher


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (AdamW, linear warm-up then constant learning rate).

    ``steps`` is the total step count, also when resuming. ``out_dir`` receives a checkpoint
    every ``checkpoint_every`` steps and at the end (``None``: no checkpoints).
    ``standardize_features``: a fresh drafter (built from a config) fits its feature
    standardisation (:meth:`DSparkDrafter.fit_feature_stats`) on the first batch; a drafter
    passed in or resumed keeps its own.
    """

    steps: int = 1000
    batch_size: int = 8
    anchors_per_sequence: int = 4
    max_seq_len: int = 512
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 0
    out_dir: str | None = None
    init_from_target_layers: tuple[int, ...] | None = None
    standardize_features: bool = True
    progress: bool = True
    device: str = "cpu"
    loss_weights: LossWeights = field(default_factory=LossWeights)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "anchors_per_sequence", "max_seq_len", "log_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        for name in ("warmup_steps", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr: expected a finite value > 0, got {self.lr}")
        if self.weight_decay < 0 or self.grad_clip <= 0:
            raise ValueError("weight_decay must be >= 0 and grad_clip > 0")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.init_from_target_layers is not None:
            out["init_from_target_layers"] = list(self.init_from_target_layers)
        return out


@dataclass
class TrainResult:
    drafter: DSparkDrafter
    step: int
    history: list[dict[str, float]]


def train_drafter(
    target: ScoringTarget,
    data: Iterable[Sequence[int] | torch.Tensor],
    config: DSparkConfig | None,
    train: TrainConfig,
    *,
    drafter: DSparkDrafter | None = None,
    resume_from: str | os.PathLike[str] | None = None,
) -> TrainResult:
    """Train a drafter for the frozen ``target`` on token sequences ``data``.

    Exactly one source of the drafter: ``config`` (a fresh drafter), ``drafter`` (continue
    training it) or ``resume_from`` (a checkpoint directory written by a previous run: weights,
    optimizer moments and step are restored; the data stream restarts from its beginning).
    Returns the drafter, the step reached and the logged history (``step``, ``loss``, ``ce``,
    ``tv``, ``bce``, ``distill``, ``acceptance``).
    """
    if sum(x is not None for x in (config, drafter, resume_from)) != 1:
        raise ValueError("give exactly one of config, drafter, resume_from")
    device = torch.device(train.device)
    if isinstance(target, torch.nn.Module):
        target.requires_grad_(False)
    if resume_from is not None:
        drafter = load_drafter(resume_from, target, device)
    elif drafter is None:
        assert config is not None
        drafter = DSparkDrafter(config, target).to(device)
        if train.init_from_target_layers:
            drafter.init_backbone_from_target(train.init_from_target_layers)
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    step, history = 0, []
    if resume_from is not None:
        state = load_training_state(resume_from, drafter, opt)
        step, history = int(state["step"]), list(state.get("history", []))
    gen = torch.Generator().manual_seed(train.seed * 1_000_003 + step)
    gamma = drafter.config.gamma
    layer_ids = list(drafter.config.target_layer_ids)
    stream = batches(data, train.batch_size, train.max_seq_len, gamma + 1, drafter.vocab_size)
    fit_stats = config is not None and train.standardize_features
    bar = _progress(train, step)
    window: list[dict[str, float]] = []
    draft_ids = drafter.draft_vocab_ids
    # A target that returns the very same output for a repeated batch (a caching target) has it
    # reduced to the draft vocabulary once, not once per step.
    last_out: object = None
    teacher: Any = None
    for ids, lengths in stream:
        if step >= train.steps:
            break
        ids = ids.to(device)
        with torch.no_grad():
            target_out = target.score(ids, layer_ids)
        if fit_stats:
            drafter.fit_feature_stats(_ordinary_positions(target_out.features, lengths))
            fit_stats = False
        if draft_ids is None:
            teacher = target_out
        elif target_out is not last_out:
            teacher = DraftVocabTeacher.from_target(target_out, draft_ids)
        last_out = target_out
        rows, anchors = sample_anchors(lengths, gamma, train.anchors_per_sequence, gen)
        terms = dspark_loss(drafter, ids, teacher, rows, anchors, train.loss_weights)
        for group in opt.param_groups:
            group["lr"] = train.lr * min(1.0, (step + 1) / max(1, train.warmup_steps))
        opt.zero_grad(set_to_none=True)
        torch.autograd.backward(terms.total)
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), train.grad_clip)
        opt.step()
        step += 1
        window.append(
            {
                "loss": float(terms.total.item()),
                "ce": terms.ce,
                "tv": terms.tv,
                "bce": terms.bce,
                "distill": terms.distill,
                "acceptance": terms.acceptance,
            }
        )
        if step % train.log_every == 0 or step == train.steps:
            entry = {"step": float(step)}
            entry.update({k: sum(w[k] for w in window) / len(window) for k in window[0]})
            history.append(entry)
            window = []
            if bar is not None:
                bar.set_postfix(loss=f"{entry['loss']:.3f}", tv=f"{entry['tv']:.3f}")
        if bar is not None:
            bar.update(1)
        if train.out_dir and train.checkpoint_every and step % train.checkpoint_every == 0:
            _checkpoint(train, drafter, opt, step, history)
    if bar is not None:
        bar.close()
    if train.out_dir:
        _checkpoint(train, drafter, opt, step, history)
    drafter.eval()
    return TrainResult(drafter=drafter, step=step, history=history)


def _ordinary_positions(features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Feature rows of positions ``1 .. len_b - 1`` (the first position is an attention sink)."""
    keep = torch.arange(features.shape[1], device=features.device)[None, :]
    mask = (keep >= 1) & (keep < lengths.to(features.device)[:, None])
    return features[mask]


def _checkpoint(
    train: TrainConfig,
    drafter: DSparkDrafter,
    opt: torch.optim.Optimizer,
    step: int,
    history: list[dict[str, float]],
) -> None:
    assert train.out_dir is not None
    out = Path(train.out_dir)
    save_drafter(drafter, out)
    save_training_state(out, drafter, opt, step, {"history": history, "train": train.to_dict()})


def _progress(train: TrainConfig, start: int) -> Any:
    if not train.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=train.steps, initial=start, desc="train drafter", unit="step")
