"""``y = x W^T + b`` in fp32 on the CPU, reading weights that are exactly bf16 values as bf16.

A decode step multiplies a few rows by every weight once, so on a CPU it costs what reading
the weights costs. A model converted from a bf16 checkpoint and run in fp32 (the embedded
SmolLM2 is) has weights whose low 16 bits are all zero: storing them as bf16 loses nothing and
halves the bytes read. :func:`bf16_panels` lays such a weight out in 32-column panels of bf16
bits, and :class:`Bf16WeightLinear` runs ``csrc/bf16_weight_linear.c`` over them: it widens each
weight exactly to fp32 and multiplies and sums in fp32, so its results equal ``F.linear``'s up
to fp32 rounding in another summation order (about 1e-6 relative).

The kernel is compiled on first use with the machine's C compiler and cached
(:mod:`deepinfer_kernels.cpu.native`); where that fails (no compiler), it reports itself
unavailable once, with a warning, and callers keep ``F.linear``. ``DEEPINFER_CPU_KERNELS=0``
turns it off.
"""

from __future__ import annotations

from pathlib import Path

import torch

from deepinfer_kernels.cpu.native import NativeFunction
from deepinfer_kernels.cpu.sources import BF16_WEIGHT_LINEAR

SOURCE = BF16_WEIGHT_LINEAR.path


PANEL = 32  # output columns per panel (csrc/bf16_weight_linear.c)


def bf16_panels(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` ``[N, K]`` (fp32, CPU) as the kernel's bf16 panels ``[ceil(N/32), K, 16, 2]``
    (int16 bit patterns, ``panels[p, k, i, h] = W[32p + 16h + i, k]``, zero past ``N``) when
    every value is exactly a bf16 value (low 16 bits zero), else None."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return None
    ints = weight.detach().contiguous().view(torch.int32)
    if bool((ints & 0xFFFF).any()):
        return None
    # The arithmetic shift leaves the high half, which fits int16 exactly.
    bits = (ints >> 16).to(torch.int16)
    n, k = bits.shape
    padded = torch.zeros(-(-n // PANEL) * PANEL, k, dtype=torch.int16)
    padded[:n] = bits
    return padded.view(-1, 2, 16, k).permute(0, 3, 2, 1).contiguous()


def unpack_panels(panels: torch.Tensor, out_features: int) -> torch.Tensor:
    """The fp32 weight ``[out_features, K]`` that :func:`bf16_panels` packed."""
    k = panels.shape[1]
    bits = panels.permute(0, 3, 2, 1).reshape(-1, k)[:out_features]
    return bits.contiguous().view(torch.bfloat16).float()


class Bf16WeightLinear:
    """The compiled kernel (:class:`~deepinfer_kernels.cpu.native.NativeFunction`), built and
    loaded on the first :meth:`available` call.

    ``enabled=None`` reads ``DEEPINFER_CPU_KERNELS`` (``0`` turns the kernel off).
    """

    def __init__(self, cache_dir: Path | None = None, enabled: bool | None = None) -> None:
        self.fn = NativeFunction(
            BF16_WEIGHT_LINEAR, "deepinfer_bf16_weight_linear", cache_dir=cache_dir, enabled=enabled
        )

    @property
    def error(self) -> str | None:
        """Why the kernel could not be built, once that was tried."""
        return self.fn.error

    def available(self) -> bool:
        """Whether the kernel can run here (builds it on the first call)."""
        return self.fn.available()

    def __call__(
        self,
        x: torch.Tensor,
        panels: torch.Tensor,
        out_features: int,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``[M, K]`` fp32, ``panels`` of an ``[out_features, K]`` weight
        (:func:`bf16_panels`), ``bias`` ``[out_features]`` fp32 or None -> ``[M, N]`` fp32."""
        if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"x must be a 2-d fp32 CPU tensor, got {x.dtype} {tuple(x.shape)}")
        n = out_features
        want = (-(-n // PANEL), x.shape[1], 16, 2)
        if panels.dtype != torch.int16 or tuple(panels.shape) != want:
            raise ValueError(
                f"panels must be int16 {want} for out_features={n}, got {panels.dtype} "
                f"{tuple(panels.shape)}"
            )
        if not panels.is_contiguous():
            raise ValueError("panels must be contiguous")
        if bias is not None and (bias.shape != (n,) or bias.dtype != torch.float32):
            raise ValueError(f"bias must be fp32 [{n}], got {bias.dtype} {tuple(bias.shape)}")
        x = x.contiguous()
        bias = None if bias is None else bias.detach().contiguous()
        y = torch.empty(x.shape[0], n, dtype=torch.float32)
        if x.shape[0] == 0 or n == 0:
            return y
        self.fn(
            x.data_ptr(),
            panels.data_ptr(),
            None if bias is None else bias.data_ptr(),
            y.data_ptr(),
            x.shape[0],
            n,
            x.shape[1],
        )
        return y
