"""`FusedLayerKernel`: a decoder layer's two compiled halves (QKV product, RoPE, K/V write;
output projection, residual, norm, SwiGLU MLP, next norm) over any weight layout, with the
operand checks, availability, and the binding of a whole step's layers that every layout
shares (bf16 panels: ``decoder_layer.py``; GGUF blocks: ``quant_decoder_layer.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

import torch

from deepinfer_kernels.cpu.abi import CSource
from deepinfer_kernels.cpu.bound_layers import BoundLayers
from deepinfer_kernels.cpu.layer_operands import LayerShape, SlotMapping
from deepinfer_kernels.cpu.layer_operands import check_mlp_operands as _check_mlp_operands
from deepinfer_kernels.cpu.layer_operands import check_norm_weights as _check_norm_weights
from deepinfer_kernels.cpu.layer_operands import check_rows as _check_rows
from deepinfer_kernels.cpu.linear import BF16_MAX_ROWS
from deepinfer_kernels.cpu.native import NativeFunction

W = TypeVar("W")


class FusedLayerKernel(Generic[W]):
    """The two compiled halves of a layer over weights ``W`` (``enabled=None`` reads
    ``DEEPINFER_CPU_KERNELS``): everything but the weights' checks and the C arguments they
    become is shared by every weight layout (:class:`DecoderLayerKernel` over bf16 panels,
    ``QuantDecoderLayerKernel`` over GGUF blocks).

    Operands are checked on every call (cheap next to Python's dispatch of the ops it
    replaces); callers own the buffers, so a forward allocates them once for all layers.
    """

    source: ClassVar[CSource]
    qkv_symbol: ClassVar[str]
    mlp_symbol: ClassVar[str]

    def __init__(self, cache_dir: Path | None = None, enabled: bool | None = None) -> None:
        self._qkv = NativeFunction(
            self.source, self.qkv_symbol, cache_dir=cache_dir, enabled=enabled
        )
        self._mlp = NativeFunction(
            self.source, self.mlp_symbol, cache_dir=cache_dir, enabled=enabled
        )
        # The last weights tuple check_weights passed, and for which shape (see bind).
        self._checked_panels: tuple[W, ...] | None = None
        self._checked_shape: LayerShape | None = None

    def check_weights(self, shape: LayerShape, weights: W, part: str = "both") -> None:
        """Raise ``ValueError`` naming the first of ``weights`` that does not fit ``shape``
        (``part``: ``"qkv"``, ``"mlp"`` or ``"both"``, as :meth:`LayerShape.check_panels`)."""
        raise NotImplementedError

    def qkv_args(
        self,
        x: torch.Tensor,
        weights: W,
        shape: LayerShape,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: SlotMapping,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
    ) -> tuple[object, ...]:
        """The QKV half's C arguments for checked operands."""
        raise NotImplementedError

    def mlp_args(
        self,
        attn: torch.Tensor,
        weights: W,
        shape: LayerShape,
        residual: torch.Tensor,
        normed: torch.Tensor,
        post_norm: torch.Tensor,
        next_norm: torch.Tensor,
        eps: float,
        scratch: torch.Tensor,
    ) -> tuple[object, ...]:
        """The MLP half's C arguments for checked operands."""
        raise NotImplementedError

    @property
    def error(self) -> str | None:
        """Why the kernel could not be built, once that was tried."""
        return self._qkv.error or self._mlp.error

    def available(self) -> bool:
        """Whether both halves can run here (builds them on the first call)."""
        return self._qkv.available() and self._mlp.available()

    def applies(self, x: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
        """Whether a step with these operands can take the compiled layer
        (:meth:`operands_fit`) and the kernel is built (on the first call)."""
        return self.operands_fit(x, k_cache, slot_mapping) and self.available()

    @staticmethod
    def operands_fit(x: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
        """Whether a step's operands suit the compiled layer, without building it: 1 to
        ``BF16_MAX_ROWS`` fp32 CPU rows ``x`` with autograd off, a contiguous fp32 cache, no
        padding slots (``-1``)."""
        return (
            0 < x.shape[0] <= BF16_MAX_ROWS
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and not torch.is_grad_enabled()
            and k_cache.dtype == torch.float32
            and k_cache.is_contiguous()
            and int(slot_mapping.min()) >= 0
        )

    @staticmethod
    def slot_mapping(slots: torch.Tensor, capacity: int) -> SlotMapping:
        """Check ``slots`` (integer ``[T]``, every one in ``[0, capacity)``: padding slots are
        not supported) once for all layers of a step."""
        if slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"slots: expected an integer [T] tensor, got {slots.dtype} {tuple(slots.shape)}"
            )
        return SlotMapping(slots.to(device="cpu", dtype=torch.int64).contiguous(), int(capacity))

    def qkv(
        self,
        x: torch.Tensor,
        panels: W,
        shape: LayerShape,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: SlotMapping,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        """``out [T, (Hq + 2 Hkv) D]`` = rotated ``x Wqkv^T (+ b)``; writes K/V at ``slots``.

        ``cos``/``sin``: RoPE tables ``[T, D]`` (``RotaryEmbedding.cos_sin`` flattened);
        ``slots``: from :meth:`slot_mapping` with the caches' ``num_blocks * block_size``;
        caches contiguous fp32 ``[num_blocks, block_size, Hkv, D]``.
        """
        self.check_weights(shape, panels, "qkv")
        self._check_qkv(x, shape, cos, sin, slots, k_cache, v_cache, out)
        if x.shape[0] == 0:
            return
        self._qkv(*self.qkv_args(x, panels, shape, cos, sin, slots, k_cache, v_cache, out))

    @staticmethod
    def _check_qkv(
        x: torch.Tensor,
        shape: LayerShape,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: SlotMapping,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        rows, d = x.shape[0], shape.head_dim
        _check_rows("x", x, rows, shape.hidden)
        _check_rows("out", out, rows, shape.qkv_width)
        _check_rows("cos", cos, rows, d)
        _check_rows("sin", sin, rows, d)
        if not isinstance(slots, SlotMapping) or tuple(slots.slots.shape) != (rows,):
            raise ValueError(f"slots: expected a SlotMapping of {rows} slots")
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if (
                cache.dtype != torch.float32
                or cache.dim() != 4
                or tuple(cache.shape[2:]) != (shape.num_kv_heads, d)
                or not cache.is_contiguous()
            ):
                raise ValueError(
                    f"{name}: expected contiguous fp32 [blocks, block_size, "
                    f"{shape.num_kv_heads}, {d}], got {cache.dtype} {tuple(cache.shape)}"
                )
        if k_cache.shape[:2] != v_cache.shape[:2]:
            raise ValueError("v_cache: expected the blocks of k_cache")
        if slots.capacity > k_cache.shape[0] * k_cache.shape[1]:
            raise ValueError(
                f"slots: checked for {slots.capacity} slots, the caches hold "
                f"{k_cache.shape[0] * k_cache.shape[1]}"
            )

    def mlp(
        self,
        attn: torch.Tensor,
        panels: W,
        shape: LayerShape,
        residual: torch.Tensor,
        normed: torch.Tensor,
        post_norm: torch.Tensor,
        next_norm: torch.Tensor,
        eps: float,
        scratch: torch.Tensor,
    ) -> None:
        """Output projection, residual add, norm, MLP, residual add, next norm, for
        ``attn [T, Hq D]``. Updates ``residual [T, H]`` in place; writes ``normed [T, H]``
        (``next_norm`` applied). ``scratch``: fp32 with ``shape.scratch_size(T)`` values.
        ``post_norm``/``next_norm`` share one ``eps`` (a Llama model's norms all do)."""
        self.check_weights(shape, panels, "mlp")
        _check_mlp_operands(attn, shape, residual, normed, post_norm, next_norm, scratch)
        if attn.shape[0] == 0:
            return
        self._mlp(
            *self.mlp_args(
                attn, panels, shape, residual, normed, post_norm, next_norm, eps, scratch
            )
        )

    def bind(
        self,
        shape: LayerShape,
        panels: tuple[W, ...],
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
    ) -> BoundLayers:
        """Every layer's :meth:`qkv` and :meth:`mlp` for one step, checked once: see
        :class:`BoundLayers`. ``norms[i]`` = layer ``i``'s ``(post_norm, next_norm)``; the
        other operands are :meth:`qkv`'s and :meth:`mlp`'s, the same buffers for every layer.

        Panels are checked once per ``panels`` tuple (a model passes the same tuple while its
        weights do not change).
        """
        layers = len(panels)
        if not (len(k_caches) == len(v_caches) == len(norms) == layers):
            raise ValueError(
                f"k_caches, v_caches, norms: expected {layers} each (one per layer), got "
                f"{len(k_caches)}, {len(v_caches)}, {len(norms)}"
            )
        if panels is not self._checked_panels or shape != self._checked_shape:
            for p in panels:
                self.check_weights(shape, p)
            self._checked_panels, self._checked_shape = panels, shape
        # The per-call checks, on layer 0's operands (every layer shares the buffers); the
        # other layers' caches must have layer 0's layout and their norms are checked each.
        if layers:
            self._check_qkv(normed, shape, cos, sin, slots, k_caches[0], v_caches[0], qkv)
            _check_mlp_operands(attn, shape, residual, normed, *norms[0], scratch)
            layout = [(t.shape, t.stride(), t.dtype) for t in (k_caches[0], v_caches[0])]
        for i in range(1, layers):
            if [(t.shape, t.stride(), t.dtype) for t in (k_caches[i], v_caches[i])] != layout:
                raise ValueError(f"k_caches[{i}]/v_caches[{i}]: expected layer 0's layout")
            _check_norm_weights(shape, *norms[i])
        qkv_args = [
            self.qkv_args(normed, p, shape, cos, sin, slots, k, v, qkv)
            for p, k, v in zip(panels, k_caches, v_caches)
        ]
        mlp_args = [
            self.mlp_args(attn, p, shape, residual, normed, post, after, eps, scratch)
            for p, (post, after) in zip(panels, norms)
        ]
        # The calls pass these tensors' addresses: the bound object keeps them alive.
        operands = (panels, normed, qkv, cos, sin, slots, tuple(k_caches), tuple(v_caches),
                    attn, residual, tuple(norms), scratch)  # fmt: skip
        return BoundLayers(self._qkv, self._mlp, qkv_args, mlp_args, operands, normed.shape[0])
