"""Drafter checkpoints: safetensors weights plus JSON metadata (no pickle).

A checkpoint is a directory:

* ``drafter.safetensors``: the drafter's own weights (never the target's);
* ``config.json``: ``{"format", "dspark": DSparkConfig.to_dict(), "hidden_size", "vocab_size"}``;
* ``sts.json`` (optional): STS temperatures ``{"greedy": [G], "sampling": [G]}``;
* ``optimizer.safetensors`` and ``trainer_state.json`` (step, history): only for resuming.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from deepinfer_spec.adapter import ScoringTarget
from deepinfer_spec.config import DSparkConfig
from deepinfer_spec.drafter import DSparkDrafter

FORMAT = "deepinfer-spec-drafter/1"
WEIGHTS, CONFIG, OPTIMIZER, TRAINER = (
    "drafter.safetensors",
    "config.json",
    "optimizer.safetensors",
    "trainer_state.json",
)
OPTIONAL_BUFFERS = ("feature_shift", "feature_scale")
STS_FILE = "sts.json"
STS_KEYS = ("greedy", "sampling")


def save_drafter(drafter: DSparkDrafter, directory: str | os.PathLike[str]) -> Path:
    """Write ``drafter.safetensors`` and ``config.json`` into ``directory``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    save_file(state, str(path / WEIGHTS), metadata={"format": FORMAT})
    meta = {
        "format": FORMAT,
        "dspark": drafter.config.to_dict(),
        "hidden_size": drafter.hidden_size,
        "vocab_size": drafter.vocab_size,
    }
    _write_json(path / CONFIG, meta)
    return path


def read_config(directory: str | os.PathLike[str]) -> DSparkConfig:
    meta = _read_json(Path(directory) / CONFIG)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{directory}: not a {FORMAT} checkpoint (format={meta.get('format')!r})")
    return DSparkConfig.from_dict(meta["dspark"])


def load_drafter(
    directory: str | os.PathLike[str], target: ScoringTarget, device: torch.device | str = "cpu"
) -> DSparkDrafter:
    """Rebuild a drafter for ``target`` from a checkpoint directory (strict key match)."""
    path = Path(directory)
    meta = _read_json(path / CONFIG)
    config = read_config(path)
    if (meta["hidden_size"], meta["vocab_size"]) != (target.hidden_size, target.vocab_size):
        raise ValueError(
            f"target: checkpoint was trained for hidden/vocab {meta['hidden_size']}/"
            f"{meta['vocab_size']}, the target has {target.hidden_size}/{target.vocab_size}"
        )
    drafter = DSparkDrafter(config, target)
    state = load_file(str(path / WEIGHTS), device=str(device))
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    # Checkpoints written before feature standardisation existed keep the identity (0, 1).
    missing = [k for k in missing if k not in OPTIONAL_BUFFERS]
    if missing or unexpected:
        raise ValueError(
            f"{path / WEIGHTS}: weights do not match the config "
            f"(missing {sorted(missing)}, unexpected {sorted(unexpected)})"
        )
    return drafter.to(device)


def load_sts(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """``{"greedy": T[G], "sampling": T[G]}`` from a checkpoint's ``sts.json`` (empty when the
    checkpoint has none)."""
    path = Path(directory) / STS_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read STS temperatures ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in data.items() if k in STS_KEYS}


def load_checkpoint(
    directory: str | os.PathLike[str],
    target: ScoringTarget,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[DSparkDrafter, dict[str, torch.Tensor]]:
    """A checkpoint directory's drafter for ``target`` (on ``device``, cast to ``dtype`` when
    given) and its STS temperatures (:func:`load_sts`; empty without ``sts.json``).

    What a serving stack needs from a checkpoint in one call; a directory without
    ``config.json`` is refused by name before anything is read.
    """
    path = Path(directory)
    if not (path / CONFIG).is_file():
        raise ValueError(
            f"directory: {os.fspath(directory)!r} is not a drafter checkpoint directory "
            f"(no {CONFIG})"
        )
    drafter = load_drafter(path, target, device)
    if dtype is not None:
        drafter = drafter.to(dtype)
    return drafter, load_sts(path)


def save_training_state(
    directory: str | os.PathLike[str],
    drafter: DSparkDrafter,
    optimizer: torch.optim.Optimizer,
    step: int,
    extra: dict[str, Any],
) -> None:
    """Optimizer moments (named after the drafter's parameters) and the step counter."""
    path = Path(directory)
    names = {id(p): n for n, p in drafter.named_parameters()}
    tensors: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
                tensors[f"{names[id(p)]}::{key}"] = t.detach().contiguous().cpu()
    save_file(tensors, str(path / OPTIMIZER), metadata={"format": FORMAT})
    _write_json(path / TRAINER, {"format": FORMAT, "step": step, **extra})


def load_training_state(
    directory: str | os.PathLike[str], drafter: DSparkDrafter, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Restore optimizer moments saved by :func:`save_training_state`; returns the JSON state."""
    path = Path(directory)
    meta = _read_json(path / TRAINER)
    tensors = load_file(str(path / OPTIMIZER))
    params = dict(drafter.named_parameters())
    device = next(iter(params.values())).device
    for key, value in tensors.items():
        name, _, slot = key.partition("::")
        if name not in params:
            raise ValueError(f"{path / OPTIMIZER}: state for unknown parameter {name!r}")
        p = params[name]
        # Adam keeps `step` as a CPU scalar tensor; moments live with the parameter.
        optimizer.state[p][slot] = value if slot == "step" else value.to(device)
    return meta


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read checkpoint metadata ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
