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
    from deepinfer_kernels.cpu.decoder_layer import LayerPanels, LayerShape, SlotMapping


def qkv_call_args(
    x: torch.Tensor,
    panels: LayerPanels,
    shape: LayerShape,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: SlotMapping,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
) -> tuple[object, ...]:
    """``deepinfer_decoder_qkv``'s arguments for checked operands (``DecoderLayerKernel.qkv``)."""
    bias = panels.qkv_bias
    return (
        x.data_ptr(),
        panels.qkv.data_ptr(),
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        slots.slots.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        x.shape[0],
        shape.hidden,
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
    )


def mlp_call_args(
    attn: torch.Tensor,
    panels: LayerPanels,
    shape: LayerShape,
    residual: torch.Tensor,
    normed: torch.Tensor,
    post_norm: torch.Tensor,
    next_norm: torch.Tensor,
    eps: float,
    scratch: torch.Tensor,
) -> tuple[object, ...]:
    """``deepinfer_decoder_mlp``'s arguments for checked operands (``DecoderLayerKernel.mlp``)."""
    return (
        attn.data_ptr(),
        panels.o.data_ptr(),
        residual.data_ptr(),
        normed.data_ptr(),
        post_norm.data_ptr(),
        panels.gate_up.data_ptr(),
        panels.down.data_ptr(),
        next_norm.data_ptr(),
        eps,
        scratch.data_ptr(),
        attn.shape[0],
        shape.hidden,
        shape.num_heads * shape.head_dim,
        shape.intermediate,
    )


def _as_ctypes(fn: NativeFunction, args: tuple[object, ...]) -> tuple[object, ...]:
    """``args`` as instances of ``fn``'s argument types (None stays NULL): ctypes passes those
    as they are, where a Python int is converted at every call (about a quarter of a bound
    call's cost, 60 calls a decode step)."""
    types = getattr(fn, "argtypes", None)
    if types is None or len(types) != len(args):
        return tuple(args)  # NativeFunction refuses the call, naming the count
    return tuple(v if v is None else t(v) for v, t in zip(args, types))


class BoundLayers:
    """One step's ``DecoderLayerKernel.qkv`` (``bound.qkv(i)``) and ``DecoderLayerKernel.mlp``
    (``bound.mlp(i)``) of layer ``i``, as one foreign call each with the arguments
    ``DecoderLayerKernel.bind`` checked and built (:func:`qkv_call_args`,
    :func:`mlp_call_args`).

    The buffers are read and written in place at every call, so they must keep their storage
    while the calls are used; ``operands`` holds references to all of them.
    """

    def __init__(
        self,
        qkv_fn: NativeFunction,
        mlp_fn: NativeFunction,
        qkv_args: Sequence[tuple[object, ...]],
        mlp_args: Sequence[tuple[object, ...]],
        operands: tuple[object, ...],
        rows: int,
    ) -> None:
        if len(qkv_args) != len(mlp_args):
            raise ValueError("mlp_args: expected one per layer, like qkv_args")
        self._qkv_fn, self._mlp_fn = qkv_fn, mlp_fn
        self._qkv_args = [_as_ctypes(qkv_fn, args) for args in qkv_args]
        self._mlp_args = [_as_ctypes(mlp_fn, args) for args in mlp_args]
        self._operands = operands
        self._rows = rows

    def __len__(self) -> int:
        return len(self._qkv_args)

    def qkv(self, layer: int) -> None:
        if self._rows:
            self._qkv_fn(*self._qkv_args[layer])

    def mlp(self, layer: int) -> None:
        if self._rows:
            self._mlp_fn(*self._mlp_args[layer])
