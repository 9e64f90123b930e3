"""What a fused decoder layer works on: its sizes (`LayerShape`), its weights as bf16 panels
(`LayerPanels`), a step's checked cache slots (`SlotMapping`), and the checks of the fp32
row, norm and scratch operands its two compiled halves take."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_kernels.cpu.bf16_weight_linear import PANEL


@dataclass(frozen=True)
class LayerPanels:
    """One decoder layer's projection weights as bf16 panels (``bf16_panels``)."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True)
class LayerShape:
    """Sizes of the layer: hidden ``H``, heads ``Hq``/``Hkv`` of size ``D``, MLP width ``I``."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int

    @property
    def qkv_width(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def scratch_size(self, rows: int) -> int:
        """Floats of scratch :meth:`DecoderLayerKernel.mlp` needs for ``rows`` rows."""
        return rows * (2 * self.hidden + 3 * self.intermediate)

    def check_panels(self, panels: LayerPanels, part: str = "both") -> None:
        """Raise ``ValueError`` naming the first panel that does not fit this shape
        (``part``: ``"qkv"`` checks the QKV panels and bias only, ``"mlp"`` the others)."""
        h, q = self.hidden, self.num_heads * self.head_dim
        want = {
            "qkv": (self.qkv_width, h),
            "o": (h, q),
            "gate_up": (2 * self.intermediate, h),
            "down": (h, self.intermediate),
        }
        if part == "qkv":
            want = {"qkv": want["qkv"]}
        elif part == "mlp":
            del want["qkv"]
        for name, (n, k) in want.items():
            t: torch.Tensor = getattr(panels, name)
            shape = (-(-n // PANEL), k, 16, 2)
            if t.dtype != torch.int16 or tuple(t.shape) != shape or not t.is_contiguous():
                raise ValueError(
                    f"panels.{name}: expected contiguous int16 {shape}, got {t.dtype} "
                    f"{tuple(t.shape)}"
                )
        bias = panels.qkv_bias
        if (
            part != "mlp"
            and bias is not None
            and (
                tuple(bias.shape) != (self.qkv_width,)
                or bias.dtype != torch.float32
                or not bias.is_contiguous()
            )
        ):
            raise ValueError(f"panels.qkv_bias: expected contiguous fp32 [{self.qkv_width}]")


@dataclass(frozen=True)
class SlotMapping:
    """A step's cache slots, checked once for every layer: int64 ``[T]``, each in
    ``[0, capacity)`` (build it with :meth:`DecoderLayerKernel.slot_mapping`)."""

    slots: torch.Tensor
    capacity: int

    def __post_init__(self) -> None:
        s = self.slots
        if (
            s.dtype != torch.int64
            or s.dim() != 1
            or s.device.type != "cpu"
            or not s.is_contiguous()
        ):
            raise ValueError(f"slots: expected a contiguous int64 CPU [T] tensor, got {s.dtype}")
        if s.numel() and (int(s.min()) < 0 or int(s.max()) >= self.capacity):
            raise ValueError(f"slots: expected values in [0, {self.capacity})")


def check_rows(name: str, t: torch.Tensor, rows: int, width: int) -> None:
    if (
        t.dtype != torch.float32
        or t.device.type != "cpu"
        or tuple(t.shape) != (rows, width)
        or not t.is_contiguous()
    ):
        raise ValueError(
            f"{name}: expected a contiguous fp32 CPU tensor [{rows}, {width}], got {t.dtype} "
            f"{tuple(t.shape)} on {t.device}"
        )


def check_mlp_operands(
    attn: torch.Tensor,
    shape: LayerShape,
    residual: torch.Tensor,
    normed: torch.Tensor,
    post_norm: torch.Tensor,
    next_norm: torch.Tensor,
    scratch: torch.Tensor,
) -> None:
    rows, h = attn.shape[0], shape.hidden
    check_rows("attn", attn, rows, shape.num_heads * shape.head_dim)
    check_rows("residual", residual, rows, h)
    check_rows("normed", normed, rows, h)
    check_norm_weights(shape, post_norm, next_norm)
    if (
        scratch.dtype != torch.float32
        or not scratch.is_contiguous()
        or scratch.numel() < shape.scratch_size(rows)
    ):
        raise ValueError(f"scratch: expected contiguous fp32 of {shape.scratch_size(rows)}")


def check_norm_weights(shape: LayerShape, post_norm: torch.Tensor, next_norm: torch.Tensor) -> None:
    h = shape.hidden
    for name, w in (("post_norm", post_norm), ("next_norm", next_norm)):
        if w.dtype != torch.float32 or tuple(w.shape) != (h,) or not w.is_contiguous():
            raise ValueError(f"{name}: expected contiguous fp32 [{h}]")
