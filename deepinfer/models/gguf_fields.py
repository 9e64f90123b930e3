"""What a GGUF file's key/value metadata and tensor names tell the Llama config: the metadata
as plain values, float32 values as their decimals, and the tensors the loader maps."""

from __future__ import annotations

from typing import Any

import numpy as np

# Per-layer GGUF tensor kinds (``blk.N.<kind>.weight|bias``) and global tensors the loader maps.
GGUF_LAYER_TENSORS = frozenset(
    {
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    }
)
GGUF_GLOBAL_TENSORS = frozenset(
    {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}
)


def check_gguf_tensors(names: set[str] | frozenset[str]) -> None:
    """Raise ``ValueError`` naming GGUF tensors the loader would otherwise drop silently."""
    unknown = []
    for name in sorted(names):
        if name in GGUF_GLOBAL_TENSORS:
            continue
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in GGUF_LAYER_TENSORS:
            continue
        unknown.append(name)
    if unknown:
        raise ValueError(
            f"GGUF tensor {unknown[0]!r} is not implemented by the Llama loader "
            f"({len(unknown)} such tensors): this architecture variant is not supported"
        )


def f32_decimal(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06), which is what the original ``config.json`` held."""
    return float(str(np.float32(value)))


def gguf_metadata(reader: Any, *, max_array_len: int = 256) -> dict[str, Any]:
    """GGUF key/value metadata as plain Python values.

    Arrays longer than ``max_array_len`` (the tokenizer's vocabulary and merges) are left out:
    converting them costs time and only the tokenizer needs them.
    """
    out: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or len(fld.data) > max_array_len:
            continue
        out[key] = fld.contents()
    return out
