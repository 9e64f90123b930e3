"""A step's compiled decoder-layer calls, bound once for every layer.

``DecoderLayerKernel.bind`` checks a step's operands once and returns :class:`BoundLayers`;
the model then runs each layer as one foreign call before the attention and one after it, with
no Python work per layer beyond the call. In a SmolLM2-135M decode step on a 2-core CPU the
per-layer checks, dispatch and allocations around the kernels (and around the attention) were
about a third of the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from deepinfer_kernels.cpu.native import NativeFunction

if TYPE_CHECKING:
    from deepinfer.model.decoder_layer_kernel import LayerPanels, LayerShape, SlotMapping


class BoundLayers:
    """One step's ``DecoderLayerKernel.qkv`` (``bound.qkv(i)``) and ``DecoderLayerKernel.mlp``
    (``bound.mlp(i)``) of layer ``i``, as one foreign call each with arguments built once
    (``DecoderLayerKernel.bind`` checked them).

    The buffers are read and written in place at every call, so they must keep their storage
    while the calls are used; the object holds references to all of them.
    """

    def __init__(
        self,
        qkv_fn: NativeFunction,
        mlp_fn: NativeFunction,
        shape: LayerShape,
        panels: tuple[LayerPanels, ...],
        normed: torch.Tensor,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: SlotMapping,
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
        attn: torch.Tensor,
        residual: torch.Tensor,
        norms: Sequence[tuple[torch.Tensor, torch.Tensor]],
        eps: float,
        scratch: torch.Tensor,
    ) -> None:
        rows, h, d = normed.shape[0], shape.hidden, shape.head_dim
        # References: the call arguments are these tensors' addresses.
        self._tensors = (panels, normed, qkv, cos, sin, slots, k_caches, v_caches, attn,
                         residual, norms, scratch)  # fmt: skip
        self._rows = rows
        self._qkv_fn, self._mlp_fn = qkv_fn, mlp_fn
        self._qkv_args = [
            (
                normed.data_ptr(),
                p.qkv.data_ptr(),
                None if p.qkv_bias is None else p.qkv_bias.data_ptr(),
                qkv.data_ptr(),
                cos.data_ptr(),
                sin.data_ptr(),
                slots.slots.data_ptr(),
                k.data_ptr(),
                v.data_ptr(),
                rows,
                h,
                shape.num_heads,
                shape.num_kv_heads,
                d,
            )
            for p, k, v in zip(panels, k_caches, v_caches)
        ]
        self._mlp_args = [
            (
                attn.data_ptr(),
                p.o.data_ptr(),
                residual.data_ptr(),
                normed.data_ptr(),
                post.data_ptr(),
                p.gate_up.data_ptr(),
                p.down.data_ptr(),
                after.data_ptr(),
                eps,
                scratch.data_ptr(),
                rows,
                h,
                shape.num_heads * d,
                shape.intermediate,
            )
            for p, (post, after) in zip(panels, norms)
        ]

    def __len__(self) -> int:
        return len(self._qkv_args)

    def qkv(self, layer: int) -> None:
        if self._rows:
            self._qkv_fn(*self._qkv_args[layer])

    def mlp(self, layer: int) -> None:
        if self._rows:
            self._mlp_fn(*self._mlp_args[layer])
