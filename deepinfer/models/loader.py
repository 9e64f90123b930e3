"""`load_model`: one entry point for GGUF files, HF directories and the embedded default."""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from deepinfer.models.chat_template import ChatTemplate, read_chat_template
from deepinfer.models.config import LlamaConfig
from deepinfer.models.convert import convert_gguf
from deepinfer.models.families import config_from_hf, model_class
from deepinfer.models.gguf_model import load_gguf_model_cached
from deepinfer.models.half_weights import build_own_dtype_model, runs_from_own_dtype
from deepinfer.models.llama import LlamaModel
from deepinfer.models.registry import default_model_path
from deepinfer.models.safetensors_loader import load_hf_dir
from deepinfer.models.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    """A model ready to run, with what is needed to talk to it."""

    model: LlamaModel
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    config: LlamaConfig
    path: Path


def build_model(
    config: LlamaConfig,
    state: dict[str, torch.Tensor],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> LlamaModel:
    """The family's model (:func:`~deepinfer.models.families.model_class`) holding ``state``
    (HF names), skipping random initialisation."""
    model = model_class(config)(config, init=False)  # storage is replaced by ``state`` now
    model.load_hf_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()})
    return model.eval().requires_grad_(False)


@dataclass
class ModelFiles:
    """What talking to a model needs besides its weights (a PD coordinator, whose workers load
    the weights themselves, holds only this)."""

    tokenizer: Tokenizer
    chat_template: ChatTemplate
    config: LlamaConfig
    path: Path


def load_model_files(
    path: str | os.PathLike[str] | None = None, *, cache_dir: str | os.PathLike[str] | None = None
) -> ModelFiles:
    """Config, tokenizer and chat template of the model :func:`load_model` would load, and the
    directory its workers load from, without reading any weight."""
    source = default_model_path() if path is None else Path(path)
    if source.is_file() and source.suffix == ".gguf":
        model_dir = convert_gguf(source, cache_dir)
    elif source.is_dir():
        model_dir = source
    else:
        raise ValueError(
            f"model path {os.fspath(source)!r} must be a .gguf file or a model directory"
        )
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model directory {os.fspath(model_dir)!r} has no config.json")
    config = config_from_hf(json.loads(config_file.read_text(encoding="utf-8")))
    tokenizer = Tokenizer.from_file(model_dir / "tokenizer.json")
    if not tokenizer.eos_token_ids and config.eos_token_ids:
        tokenizer.eos_token_ids = config.eos_token_ids
    return ModelFiles(tokenizer, read_chat_template(model_dir, tokenizer), config, model_dir)


def load_model(
    path: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
) -> LoadedModel:
    """Load a Llama-family model.

    ``path`` is a ``.gguf`` file (its tokenizer and config converted once into the cache, see
    :func:`deepinfer.models.convert.convert_gguf`), a Hugging Face model directory, or None for
    the embedded SmolLM2-135M-Instruct. In fp32 a GGUF file's matrices stay in their block
    formats (:mod:`deepinfer.models.gguf_model`): the checkpoint's exact values, computed in
    fp32, 4-8x less memory than fp32 copies.
    """
    source = default_model_path() if path is None else Path(path)
    gguf_source = source.is_file() and source.suffix == ".gguf"
    if gguf_source:
        model_dir = convert_gguf(source, cache_dir)
    elif source.is_dir():
        model_dir = source
    else:
        raise ValueError(
            f"model path {os.fspath(source)!r} must be a .gguf file or a model directory"
        )
    # The tokenizer first: parsing its JSON leaves ~25 MB of freed heap behind, which
    # release_free_heap() below hands back before the weights are touched.
    tokenizer = Tokenizer.from_file(model_dir / "tokenizer.json")
    model: LlamaModel
    if gguf_source and dtype == torch.float32:
        # The file's own weights: block formats kept as they are, fp32 arithmetic.
        model = load_gguf_model_cached(source, model_dir).to(device)
        config = model.config
    else:
        # A checkpoint's own dtype (bf16/fp16 safetensors) converts to ``dtype`` exactly
        # when ``dtype`` is wider; a GGUF file asked for in another dtype runs from its
        # converted copy.
        config, state = load_hf_dir(model_dir)
        if runs_from_own_dtype(state, dtype, device):
            # fp32 arithmetic on the checkpoint's bf16/fp16 matrices, one copy each.
            model = build_own_dtype_model(config, state, model_class(config)(config, init=False))
        else:
            model = build_model(config, state, dtype=dtype, device=device)
        del state
    if not tokenizer.eos_token_ids and config.eos_token_ids:
        tokenizer.eos_token_ids = config.eos_token_ids
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        chat_template=read_chat_template(model_dir, tokenizer),
        config=config,
        path=model_dir,
    )
    release_free_heap()
    return loaded


def release_free_heap() -> None:
    """Return the heap that loading freed to the OS (glibc's ``malloc_trim(0)``; a no-op
    elsewhere).

    glibc gives back only the free memory at the top of its heap on ``free``; the tokenizer's
    parsed JSON and the loader's transient buffers sit below what stays alive, so their pages
    stayed resident for the life of the process (27 MB for SmolLM2's tokenizer, measured by
    ``benchmarks/engine_memory.py``). Nothing else changes: the next allocations fault fresh
    pages in as usual."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
