"""Build a :class:`~deepinfer.models.LlamaModel` straight from a GGUF file, weights in their
file formats: the checkpoint's exact values, one copy each, in the layout the kernel reads.

Each projection whose tensors are stored in a block format becomes a
:class:`~deepinfer.models.quant_layers.QuantLinear` over the file's bytes (Q/K/V and gate/up
fused by concatenating their rows, whatever their formats); a block-format token table becomes
a :class:`~deepinfer.models.quant_layers.QuantEmbedding`, which is also the tied LM head.
Norms, biases and F32 matrices load as fp32 tensors. Nothing is rounded: a Q4_1 weight is the
number ``gguf.quants.dequantize`` gives, the arithmetic is fp32.

Example::

    model = load_gguf_model("SmolLM2-135M-Instruct.Q4_1.gguf")
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from deepinfer.models.cache_files import exclusive_lock
from deepinfer.models.config import LlamaConfig
from deepinfer.models.gguf_loader import load_gguf_blocks, open_gguf
from deepinfer.models.llama import LlamaModel
from deepinfer.models.quant_layers import QuantEmbedding, QuantLinear
from deepinfer.models.weight_names import hf_to_fused
from deepinfer_kernels.quant import QuantType, QuantWeight, row_bytes

# (module path under a decoder layer, HF projections fused into it)
_PROJECTIONS = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("self_attn.o_proj", ("self_attn.o_proj",)),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.down_proj", ("mlp.down_proj",)),
)


def _as_block(weight: torch.Tensor) -> QuantWeight:
    """An fp32 matrix as an F32 'block' weight (its bytes), to join block-format parts."""
    data = weight.detach().to(torch.float32).contiguous().view(torch.uint8)
    return QuantWeight(data.reshape(weight.shape[0], -1), QuantType.F32, int(weight.shape[1]))


def _quant_projection(
    names: Sequence[str], floats: dict[str, torch.Tensor], blocks: dict[str, QuantWeight]
) -> QuantLinear | None:
    """The fused projection of HF ``names`` when any of them is in a block format (popping
    what it uses), else None (it stays a float Linear)."""
    weights = [f"{n}.weight" for n in names]
    if not any(w in blocks for w in weights):
        return None
    parts = [blocks.pop(w) if w in blocks else _as_block(floats.pop(w)) for w in weights]
    biases = [floats.pop(f"{n}.bias", None) for n in names]
    if any(b is not None for b in biases) and not all(b is not None for b in biases):
        raise ValueError(f"{names[0]}: some fused projections have a bias and others not")
    bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
    module = QuantLinear(parts, bias)
    joined = _joined_view([p.data for p in parts]) if len(parts) > 1 else None
    if joined is not None:
        # The parts already lie back to back (a fused projection read from the blocks file):
        # hold that memory map, not the concatenated copy, so each weight is in memory once.
        module.weight = nn.Parameter(joined, requires_grad=False)
    return module


def _joined_view(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``parts`` (uint8) as one flat view when they lie back to back in one storage, else None."""
    first = parts[0]
    start = end = first.storage_offset()
    storage = first.untyped_storage().data_ptr()
    for part in parts:
        if (
            part.dtype != torch.uint8
            or not part.is_contiguous()
            or part.untyped_storage().data_ptr() != storage
            or part.storage_offset() != end
        ):
            return None
        end += part.numel()
    return first.as_strided((end - start,), (1,), start)


def _fused_groups(
    floats: dict[str, torch.Tensor], blocks: dict[str, QuantWeight]
) -> dict[str, list[str]]:
    """``{fused weight name: [HF weight names]}`` for each multi-part projection that
    :func:`build_gguf_model` joins into one :class:`QuantLinear` (a part in a block format;
    the others may be F32 matrices, joined as F32 'blocks')."""
    layers = {m.group(1) for n in blocks if (m := re.match(r"^(model\.layers\.\d+)\.", n))}
    groups = {}
    for prefix in sorted(layers):
        for path, names in _PROJECTIONS:
            weights = [f"{prefix}.{n}.weight" for n in names]
            if (
                len(weights) > 1
                and any(w in blocks for w in weights)
                and all(w in blocks or w in floats for w in weights)
            ):
                groups[f"{prefix}.{path}.weight"] = weights
    return groups


def build_gguf_model(
    config: LlamaConfig,
    floats: dict[str, torch.Tensor],
    blocks: dict[str, QuantWeight],
    *,
    model: LlamaModel | None = None,
) -> LlamaModel:
    """A CPU fp32 :class:`LlamaModel` over ``floats`` and ``blocks`` (HF names, as
    :func:`~deepinfer.models.gguf_loader.load_gguf_blocks` returns them; both are consumed).
    ``model``: an unloaded model of ``config``'s family (built with ``init=False``) to fill;
    default a new :class:`LlamaModel`. Raises ``ValueError`` naming a missing, unexpected or
    mis-shaped tensor."""
    floats, blocks = dict(floats), dict(blocks)
    model = LlamaModel(config, init=False) if model is None else model
    replaced: set[str] = set()
    for i, layer in enumerate(model.decoder_layers()):
        for path, names in _PROJECTIONS:
            module = _quant_projection([f"model.layers.{i}.{n}" for n in names], floats, blocks)
            if module is None:
                continue
            parent_name, attr = path.split(".")
            parent: nn.Module = getattr(layer, parent_name)
            old = getattr(parent, attr)
            if (module.out_features, module.in_features) != tuple(old.weight.shape):
                raise ValueError(
                    f"layer {i} {path}: GGUF weights are {module.out_features}x"
                    f"{module.in_features}, the config expects {tuple(old.weight.shape)}"
                )
            setattr(parent, attr, module)
            replaced.update(f"layers.{i}.{path}.{p}" for p in ("weight", "bias"))
    table = blocks.pop("model.embed_tokens.weight", None)
    if table is not None:
        if table.shape != (config.vocab_size, config.hidden_size):
            raise ValueError(f"token_embd: expected {config.vocab_size}x{config.hidden_size}")
        model.embed_tokens = QuantEmbedding(table)
        replaced.add("embed_tokens.weight")
    head = blocks.pop("lm_head.weight", None)
    if head is not None and not config.tie_word_embeddings:
        model.lm_head = QuantLinear([head])
        replaced.update({"lm_head.weight", "lm_head.bias"})
    if blocks:
        raise ValueError(f"unexpected GGUF tensors: {sorted(blocks)[:5]}")
    fused = hf_to_fused(floats, config)
    own = model.state_dict()
    expected = set(own) - replaced
    missing, unexpected = sorted(expected - set(fused)), sorted(set(fused) - expected)
    if missing or unexpected:
        raise ValueError(
            f"GGUF file does not match the config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for name, tensor in fused.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, expected "
                             f"{tuple(own[name].shape)}")  # fmt: skip
    model.load_state_dict(
        {k: v.to(torch.float32) for k, v in fused.items()}, strict=False, assign=True
    )
    return model.eval().requires_grad_(False)


def load_gguf_model(path: str | os.PathLike[str]) -> LlamaModel:
    """The model of a GGUF file with its matrices in their file formats (see module doc)."""
    reader = open_gguf(path)
    config = LlamaConfig.from_gguf_metadata(reader)
    floats, blocks = load_gguf_blocks(reader, config)
    return build_gguf_model(config, floats, blocks)


# Not *.safetensors: the directory is also an HF model directory, whose loader reads every
# *.safetensors file as a shard of the bf16 copy.
BLOCKS_FILE = "gguf-blocks.st"
# 2: fused projections (QKV, gate/up) stored joined, so loading maps them without a copy.
BLOCKS_FORMAT = 2


def _save_blocks(
    path: Path,
    config: LlamaConfig,
    floats: dict[str, torch.Tensor],
    blocks: dict[str, QuantWeight],
    source_marker: str,
) -> None:
    """Write the GGUF tensors (block bytes and floats) as one safetensors file, atomically."""
    from safetensors.torch import save_file

    groups = _fused_groups(floats, blocks)
    joined = {w for names in groups.values() for w in names}
    tensors = {name: t.contiguous() for name, t in floats.items() if name not in joined}
    tensors.update({name: w.data for name, w in blocks.items() if name not in joined})
    fused = {}
    for name, names in groups.items():
        parts = [blocks[w] if w in blocks else _as_block(floats[w]) for w in names]
        tensors[name] = torch.cat([p.data.reshape(-1) for p in parts])
        fused[name] = [[w, int(p.qtype), p.rows, p.cols] for w, p in zip(names, parts)]
    meta = {
        "format": str(BLOCKS_FORMAT),
        "source": source_marker,
        "config": json.dumps(config.to_hf_config()),
        "blocks": json.dumps(
            {n: [int(w.qtype), w.cols] for n, w in blocks.items() if n not in joined}
        ),
        "fused": json.dumps(fused),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, os.fspath(tmp), metadata=meta)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_blocks(
    path: Path, source_marker: str
) -> tuple[LlamaConfig, dict[str, torch.Tensor], dict[str, QuantWeight]] | None:
    """The saved tensors, or None when the file is missing, from another source or format,
    or unreadable (a corrupt cache file is a miss, never served)."""
    from safetensors import safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(os.fspath(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("format") != str(BLOCKS_FORMAT) or meta.get("source") != source_marker:
                return None
            config = LlamaConfig.from_hf_config(json.loads(meta["config"]))
            kinds = json.loads(meta["blocks"])
            fused = json.loads(meta["fused"])
            floats: dict[str, torch.Tensor] = {}
            blocks: dict[str, QuantWeight] = {}
            for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                tensor = fh.get_tensor(name)  # a view of the file's memory map, not a copy
                if name in fused:
                    blocks.update(_split_fused(tensor, fused[name]))
                elif name in kinds:
                    qtype, cols = kinds[name]
                    blocks[name] = QuantWeight(tensor, QuantType(qtype), int(cols))
                else:
                    floats[name] = tensor
    except Exception:  # safetensors / json / QuantWeight errors all mean: rebuild
        return None
    return config, floats, blocks


def _split_fused(flat: torch.Tensor, parts: list[list[Any]]) -> dict[str, QuantWeight]:
    """The parts of a joined projection as views of ``flat`` (``[[name, qtype, rows, cols]]``)."""
    out, start = {}, 0
    for name, qtype, rows, cols in parts:
        size = int(rows) * row_bytes(QuantType(qtype), int(cols))
        out[name] = QuantWeight(flat[start : start + size].view(int(rows), -1), QuantType(qtype),
                                int(cols))  # fmt: skip
        start += size
    if start != flat.numel():
        raise ValueError(f"fused tensor of {flat.numel()} bytes, parts of {start}")
    return out


def load_gguf_model_cached(
    source: str | os.PathLike[str], converted_dir: str | os.PathLike[str]
) -> LlamaModel:
    """:func:`load_gguf_model`, reading the GGUF file only the first time.

    ``converted_dir`` is ``convert_gguf(source)``'s directory (tokenizer, config and the
    source's fingerprint in ``deepinfer.json``): the file's tensors are kept there as
    ``gguf-blocks.st`` (safetensors: block bytes as uint8, exactly the file's), valid while
    its recorded fingerprint equals the directory's. Parsing a GGUF file's metadata (its vocabulary) takes
    seconds in the ``gguf`` package; a safetensors read is a memory map.
    """
    from deepinfer.models.convert import MARKER

    directory = Path(converted_dir)
    marker = (directory / MARKER).read_text(encoding="utf-8")
    cached = _read_blocks(directory / BLOCKS_FILE, marker)
    if cached is None:
        with exclusive_lock(directory.parent / f".{directory.name}.blocks.lock"):
            cached = _read_blocks(directory / BLOCKS_FILE, marker)
            if cached is None:
                reader = open_gguf(source)
                config = LlamaConfig.from_gguf_metadata(reader)
                floats, blocks = load_gguf_blocks(reader, config)
                _save_blocks(directory / BLOCKS_FILE, config, floats, blocks, marker)
                # Served from the file just written: its memory map, not the parsed copies.
                cached = _read_blocks(directory / BLOCKS_FILE, marker) or (config, floats, blocks)
                del floats, blocks
    return build_gguf_model(*cached)
