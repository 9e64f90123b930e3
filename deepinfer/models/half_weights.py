"""bf16/fp16 safetensors checkpoints run in fp32 from their own dtype (#24).

Widening a bf16 checkpoint to fp32 doubles its bytes, and the CPU products then kept more
copies beside it (an MKL-packed fp32 copy, bf16 panels). Here each matrix stays the tensor the
checkpoint holds: a bf16 (fp16) projection becomes a
:class:`~deepinfer.models.quant_layers.QuantLinear` over that tensor's bytes as a ``BF16``
(``F16``) weight, the token table a
:class:`~deepinfer.models.quant_layers.QuantEmbedding` (also the tied head). Their kernel
(``deepinfer_kernels.quant``) widens each weight exactly to fp32 and computes in fp32, so the
logits are those of the checkpoint widened to fp32, up to fp32 summation order. On an AVX2 CPU
this row-major bf16 kernel was the fastest exact product of those measured (the 32-column bf16
panels ran 2x slower for one row and far slower for 16); whole decode steps ran 1.3-1.5x the
widened model's (``benchmarks/gguf_decode_paths.py``). Norms and biases (vectors) are widened
to fp32.

Example::

    config, state = load_hf_dir("SmolLM2-135M-Instruct")      # bf16 tensors
    model = build_own_dtype_model(config, state)             # fp32 arithmetic, bf16 bytes
"""

from __future__ import annotations

import torch

from deepinfer.models.config import LlamaConfig
from deepinfer.models.gguf_model import build_gguf_model
from deepinfer.models.llama import LlamaModel
from deepinfer_kernels.quant import QuantType, QuantWeight

HALF_TYPES: dict[torch.dtype, QuantType] = {
    torch.bfloat16: QuantType.BF16,
    torch.float16: QuantType.F16,
}


def half_block(tensor: torch.Tensor) -> QuantWeight:
    """A bf16/fp16 CPU matrix ``[rows, cols]`` as a ``BF16``/``F16`` weight over its own bytes
    (a view: no copy when ``tensor`` is contiguous)."""
    if tensor.dtype not in HALF_TYPES or tensor.dim() != 2:
        raise ValueError(f"tensor: expected a 2-d bf16/fp16 matrix, got {tensor.dtype} "
                         f"{tuple(tensor.shape)}")  # fmt: skip
    data = tensor.detach().contiguous().view(torch.uint8)
    return QuantWeight(data, HALF_TYPES[tensor.dtype], int(tensor.shape[1]))


def runs_from_own_dtype(
    state: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device | str
) -> bool:
    """Whether :func:`build_own_dtype_model` serves a load of ``state`` in ``dtype`` on
    ``device``: fp32 asked for, on the CPU, and some matrix is stored in bf16/fp16. (Asked for
    in bf16 or fp16 the model runs in that dtype; on a GPU the float path is kept.)"""
    return (
        dtype == torch.float32
        and torch.device(device).type == "cpu"
        and any(t.dim() == 2 and t.dtype in HALF_TYPES for t in state.values())
    )


def build_own_dtype_model(
    config: LlamaConfig, state: dict[str, torch.Tensor], model: LlamaModel | None = None
) -> LlamaModel:
    """A CPU fp32 model over ``state`` (HF names) whose bf16/fp16 matrices stay as they are.

    ``model``: an unloaded model of the config's family (``init=False``), default a
    :class:`LlamaModel`. Matrices in other dtypes join fused projections as fp32 rows; vectors
    load as fp32. Raises ``ValueError`` naming a missing, unexpected or mis-shaped tensor.
    """
    blocks: dict[str, QuantWeight] = {}
    floats: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if tensor.dim() == 2 and tensor.dtype in HALF_TYPES and name.endswith(".weight"):
            blocks[name] = half_block(tensor)
        else:
            floats[name] = tensor.to(torch.float32)
    if config.tie_word_embeddings:
        # A tied checkpoint may still store the head; the table serves as the head.
        blocks.pop("lm_head.weight", None)
        floats.pop("lm_head.weight", None)
    elif "lm_head.weight" in floats:
        blocks["lm_head.weight"] = _float_block(floats.pop("lm_head.weight"))
    if "model.embed_tokens.weight" in floats:
        blocks["model.embed_tokens.weight"] = _float_block(floats.pop("model.embed_tokens.weight"))
    return build_gguf_model(config, floats, blocks, model=model)


def _float_block(weight: torch.Tensor) -> QuantWeight:
    """An fp32 matrix as an F32 weight (its bytes), for a table or head stored in fp32."""
    data = weight.detach().to(torch.float32).contiguous().view(torch.uint8)
    return QuantWeight(data, QuantType.F32, int(weight.shape[1]))
