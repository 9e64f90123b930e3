"""``(r, norm(r))`` with ``r = residual + delta``: the residual add and the RMSNorm after it.

Every decoder layer adds a block's output into the residual stream and normalises the sum for
the next block. On a CPU with few rows that is six small torch ops per norm; the compiled
``csrc/add_rms_norm.c`` does it in one pass, in fp32, rounding in the order of Hugging Face's
``LlamaRMSNorm`` (``(r * rsqrt(mean(r^2) + eps)) * weight``), so results equal the torch ops up
to fp32 rounding. :func:`add_rms_norm` picks the kernel when it applies (CPU, fp32, contiguous,
no autograd) and the torch ops otherwise.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from deepinfer_kernels.cpu.native import NativeFunction
from deepinfer_kernels.cpu.sources import ADD_RMS_NORM

SOURCE = ADD_RMS_NORM.path


class AddRmsNorm:
    """The compiled kernel, built on the first :meth:`available` call (``enabled=None`` reads
    ``DEEPINFER_CPU_KERNELS``)."""

    def __init__(self, cache_dir: Path | None = None, enabled: bool | None = None) -> None:
        self.fn = NativeFunction(
            ADD_RMS_NORM, "deepinfer_add_rms_norm", cache_dir=cache_dir, enabled=enabled
        )

    def available(self) -> bool:
        return self.fn.available()

    @staticmethod
    def applies(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> bool:
        """Whether these operands can take the kernel: fp32 CPU, contiguous, same shapes."""
        tensors = [residual, weight] if delta is None else [residual, delta, weight]
        return (
            not torch.is_grad_enabled()
            and residual.dim() >= 1
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and all(t.is_contiguous() for t in tensors)
            and (delta is None or delta.shape == residual.shape)
            and weight.shape == residual.shape[-1:]
        )

    def __call__(
        self, residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.applies(residual, delta, weight):
            raise ValueError(
                "add_rms_norm kernel: residual, delta and weight must be contiguous fp32 CPU "
                "tensors with matching shapes, and autograd off"
            )
        size = residual.shape[-1]
        rows = residual.numel() // size if size else 0
        summed = residual if delta is None else torch.empty_like(residual)
        out = torch.empty_like(residual)
        if rows and size:
            self.fn(
                residual.data_ptr(),
                None if delta is None else delta.data_ptr(),
                weight.data_ptr(),
                None if delta is None else summed.data_ptr(),
                out.data_ptr(),
                rows,
                size,
                eps,
            )
        return summed, out


def add_rms_norm(
    residual: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    kernel: AddRmsNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r, rms_norm(r) * weight)`` with ``r = residual + delta`` (``r = residual`` when
    ``delta`` is None), on ``kernel`` when it applies and is built, else with torch ops.

    While ``torch.compile`` traces, the registered op ``deepinfer::add_rms_norm`` stands in
    (its fake gives the compiler the shapes; a foreign call cannot be traced)."""
    if kernel is not None and torch.compiler.is_compiling():
        out: tuple[torch.Tensor, torch.Tensor] = torch.ops.deepinfer.add_rms_norm(
            residual, delta, weight, eps
        )
        return out
    if kernel is not None and kernel.applies(residual, delta, weight) and kernel.available():
        return kernel(residual, delta, weight, eps)
    summed = residual if delta is None else residual + delta
    return summed, rms_norm(summed, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` with torch ops, the mean taken in fp32."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # One fused op instead of six small ones.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
