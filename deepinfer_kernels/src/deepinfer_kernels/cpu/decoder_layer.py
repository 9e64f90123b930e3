"""A decoder layer as two compiled calls around its attention (few-row CPU steps).

In a decode step on a CPU the arithmetic of a layer for one row is microseconds, and the torch
ops around the matrix products (RoPE, the K/V write, SiLU * up, the residual adds and norms,
views and allocations) cost more than the products once each pays its dispatch from Python.
``csrc/decoder_layer.c`` runs everything before the attention (QKV product, RoPE, K/V write)
as one call and everything after it (output projection, residual add, norm, SwiGLU MLP,
residual add, the next layer's input norm) as another, reading the weights as bf16 panels
(:mod:`deepinfer_kernels.cpu.bf16_weight_linear`) with fp32 arithmetic. Results equal the torch
layer's up to fp32 rounding; a model (``deepinfer.models.LlamaModel``) takes this path for steps of
up to ``BF16_MAX_ROWS`` rows whose every projection weight is bf16-exact, and its torch ops
otherwise.

Built on first use with the machine's C compiler (:mod:`deepinfer_kernels.cpu.native`); where
it cannot be, it reports itself unavailable once, with a warning.

One concept per module: this one binds the bf16-panel layout to the C source;
``fused_layer_kernel.py`` holds what every layout shares, ``layer_operands.py`` the shapes,
weights and operand checks.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.cpu.bound_layers import mlp_call_args, qkv_call_args
from deepinfer_kernels.cpu.fused_layer_kernel import FusedLayerKernel
from deepinfer_kernels.cpu.layer_operands import LayerPanels, LayerShape, SlotMapping
from deepinfer_kernels.cpu.sources import DECODER_LAYER

__all__ = [
    "SOURCE",
    "DecoderLayerKernel",
    "FusedLayerKernel",
    "LayerPanels",
    "LayerShape",
    "SlotMapping",
]

SOURCE = DECODER_LAYER.path


class DecoderLayerKernel(FusedLayerKernel[LayerPanels]):
    """The two compiled halves of a layer over bf16 panels (``csrc/decoder_layer.c``)."""

    source = DECODER_LAYER
    qkv_symbol = "deepinfer_decoder_qkv"
    mlp_symbol = "deepinfer_decoder_mlp"

    def check_weights(self, shape: LayerShape, weights: LayerPanels, part: str = "both") -> None:
        shape.check_panels(weights, part)

    def qkv_args(
        self,
        x: torch.Tensor,
        weights: LayerPanels,
        shape: LayerShape,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: SlotMapping,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
    ) -> tuple[object, ...]:
        return qkv_call_args(x, weights, shape, cos, sin, slots, k_cache, v_cache, out)

    def mlp_args(
        self,
        attn: torch.Tensor,
        weights: LayerPanels,
        shape: LayerShape,
        residual: torch.Tensor,
        normed: torch.Tensor,
        post_norm: torch.Tensor,
        next_norm: torch.Tensor,
        eps: float,
        scratch: torch.Tensor,
    ) -> tuple[object, ...]:
        return mlp_call_args(
            attn, weights, shape, residual, normed, post_norm, next_norm, eps, scratch
        )
