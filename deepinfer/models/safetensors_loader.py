"""Read and write Hugging Face model directories (``config.json`` + ``*.safetensors``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from deepinfer.models.config import LlamaConfig


def load_hf_config(model_dir: str | os.PathLike[str]) -> LlamaConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"model directory {os.fspath(model_dir)!r} has no config.json")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object")
    from deepinfer.models.families import config_from_hf  # families import the model classes

    return config_from_hf(raw)


def load_safetensors_dir(
    model_dir: str | os.PathLike[str], *, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """All tensors of every ``*.safetensors`` shard in ``model_dir`` (cast to ``dtype`` if given)."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"model directory {os.fspath(model_dir)!r} has no *.safetensors file")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            shard = load_file(os.fspath(file))
        except Exception as exc:  # safetensors raises its own error type on corrupt headers
            raise ValueError(f"{file} is not a readable safetensors file: {exc}") from exc
        duplicate = set(shard) & set(state)
        if duplicate:
            raise ValueError(f"tensor {sorted(duplicate)[0]!r} appears in more than one shard")
        state.update(shard)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    return state


def load_hf_dir(
    model_dir: str | os.PathLike[str], *, dtype: torch.dtype | None = None
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Config and HF-named weights of a Hugging Face Llama-family model directory."""
    return load_hf_config(model_dir), load_safetensors_dir(model_dir, dtype=dtype)


def save_hf_dir(
    model_dir: str | os.PathLike[str],
    config: LlamaConfig,
    state: dict[str, torch.Tensor],
    *,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """Write ``config.json`` and ``model.safetensors`` (weights cast to ``dtype``) into a directory.

    Not atomic by itself: :mod:`deepinfer.models.convert` writes into a temporary directory and
    renames it.
    """
    from safetensors.torch import save_file

    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_cfg = config.to_hf_config()
    hf_cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(hf_cfg, indent=2), encoding="utf-8")
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in state.items()}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, os.fspath(out / "model.safetensors"), metadata={"format": "pt"})
