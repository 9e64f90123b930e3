"""``quant_linear`` / ``dequantize``: products with weights held in GGUF block formats.

Paths (the op decides; all compute ``x W^T`` in fp32 with ``W`` exactly the format's values):

* CUDA tensors (or ``use_triton=True`` under ``TRITON_INTERPRET=1``): the Triton kernel, which
  dequantises tiles of ``W`` in registers and never writes ``W`` out;
* CPU, up to ``GEMV_MAX_ROWS`` rows (decode, verification, a decode step of up to 16
  sequences): the C kernel, which decodes each block of ``W`` once per call and applies it to
  every row of ``x`` from registers or L1 (1-4 rows: ``gguf_blocks.h``; 5-16:
  ``gguf_tile_rows.h``; 11-12 rows and K-quants at 3-12: 12-row fp32 panels, ``gguf_panel.h``);
* CPU, more rows (prefill): ``W`` dequantised once into a temporary fp32 matrix by the C kernel
  and multiplied by a BLAS sgemm (reading ``W`` once per call either way, and the GEMM wins
  there): OpenBLAS or MKL, whichever :mod:`deepinfer_kernels.quant.dense_gemm` picks for the CPU;
* anything else, or no C compiler: the torch reference.

``torch.ops.deepinfer.quant_linear`` is registered with a fake, so it traces under
``torch.compile``; eager calls run its body directly (see :func:`~deepinfer_kernels._dispatch.eager_or_op`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels.quant.cpu import QuantGemvKernel
from deepinfer_kernels.quant.dense_gemm import default_dense_gemm
from deepinfer_kernels.quant.formats import QuantType, QuantWeight, quant_type
from deepinfer_kernels.reference.quant import dequantize_reference

# Rows up to which the fused C kernel beats dequantise-then-MKL on CPU
# (benchmarks/bench_kernels_quant.py sweeps it).
GEMV_MAX_ROWS = 16


@functools.lru_cache(maxsize=1)
def default_cpu_kernel() -> QuantGemvKernel:
    """The process's handle of the C kernel (a cache: built and loaded on first use)."""
    return QuantGemvKernel()


def _cpu_kernel_ready() -> QuantGemvKernel | None:
    kernel = default_cpu_kernel()
    return kernel if kernel.available() else None


def dequantize_impl(data: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    kind = QuantType(qtype)
    if data.device.type == "cpu" and (kernel := _cpu_kernel_ready()) is not None:
        return kernel.dequantize(data.contiguous(), kind, cols)
    return dequantize_reference(data, kind)


def quant_linear_impl(
    x: torch.Tensor,
    data: torch.Tensor,
    qtype: int,
    cols: int,
    bias: torch.Tensor | None,
    use_triton: bool,
) -> torch.Tensor:
    kind = QuantType(qtype)
    lead = x.shape[:-1]
    flat = x.reshape(-1, cols)
    if use_triton:
        from deepinfer_kernels.quant.triton_quant import quant_linear_triton

        return quant_linear_triton(flat, data, kind, cols, bias).view(*lead, data.shape[0])
    if x.device.type == "cpu" and x.dtype == torch.float32:
        kernel = _cpu_kernel_ready()
        if kernel is not None and 0 < flat.shape[0] <= GEMV_MAX_ROWS:
            if flat.stride(-1) != 1:
                flat = flat.contiguous()
            b = None if bias is None else bias.to(torch.float32).contiguous()
            return kernel.linear(flat, data, kind, cols, b).view(*lead, data.shape[0])
        gemm = default_dense_gemm()
        sgemm = gemm.in_region_sgemm()
        if kernel is not None and sgemm is not None and flat.shape[0] > 0:
            if flat.stride(-1) != 1:
                flat = flat.contiguous()
            b = None if bias is None else bias.to(torch.float32).contiguous()
            with sgemm.one_thread() as address:
                y = kernel.linear(flat, data, kind, cols, b, sgemm=address)
            return y.view(*lead, data.shape[0])
        w = dequantize_impl(data, qtype, cols)
        return gemm(x, w, None if bias is None else bias.to(torch.float32))
    w = dequantize_reference(data, kind).to(x.device)
    y = F.linear(x.to(torch.float32), w, None if bias is None else bias.to(torch.float32))
    return y.to(x.dtype)


quant_linear_op = torch.library.custom_op(
    "deepinfer::quant_linear", quant_linear_impl, mutates_args=()
)


@quant_linear_op.register_fake
def _(
    x: torch.Tensor,
    data: torch.Tensor,
    qtype: int,
    cols: int,
    bias: torch.Tensor | None,
    use_triton: bool,
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], data.shape[0])


dequantize_op = torch.library.custom_op("deepinfer::dequantize", dequantize_impl, mutates_args=())


@dequantize_op.register_fake
def _(data: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    return data.new_empty(data.shape[0], cols, dtype=torch.float32)


def _check(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None) -> None:
    if not isinstance(weight, QuantWeight):
        raise TypeError(f"weight: expected a QuantWeight, got {type(weight).__name__}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError("x: expected a floating-point tensor")
    if x.dim() == 0 or x.shape[-1] != weight.cols:
        raise ValueError(
            f"x: expected [..., {weight.cols}] (the weight's cols), got {tuple(x.shape)}"
        )
    if x.device != weight.data.device:
        raise ValueError(f"x is on {x.device}, weight.data on {weight.data.device}")
    if bias is not None and (
        bias.shape != (weight.rows,) or bias.device != x.device or not bias.is_floating_point()
    ):
        raise ValueError(f"bias: expected a float tensor [{weight.rows}] on {x.device}")


def quant_linear(
    x: torch.Tensor,
    weight: QuantWeight,
    bias: torch.Tensor | None = None,
    *,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """``x W^T (+ bias)`` for ``x`` ``[..., cols]`` and a block-format ``weight`` ``[rows,
    cols]``: fp32 arithmetic, result in the dtype of ``x``, ``W`` never materialised on the
    GPU. Raises ``ValueError``/``TypeError`` naming a mis-shaped or misplaced argument.

    Example::

        w = QuantWeight(raw_bytes, QuantType.Q4_K, cols=2048)  # raw_bytes: uint8 [rows, 1152]
        y = quant_linear(torch.randn(3, 2048), w)               # [3, rows]
    """
    _check(x, weight, bias)
    triton = should_use_triton(x.device, use_triton)
    fn = eager_or_op(quant_linear_op, quant_linear_impl)
    out: torch.Tensor = fn(x, weight.data, int(weight.qtype), weight.cols, bias, triton)
    return out


def quant_swiglu(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor | None:
    """``silu(x Wg^T) * (x Wu^T)`` ``[..., rows / 2]`` for a gate-and-up ``weight`` (the gate's
    rows, then the up's, one format), in one pass of the compiled AVX-512 GEMM
    (``quant/csrc/gguf_zmm_gemm.h``: no ``[T, rows]`` product in memory, no separate silu
    and mul), or None where that path does not apply: then compute it as ``gate, up =
    quant_linear(x, weight).chunk(2, -1); F.silu(gate) * up``. It applies to fp32 CPU ``x``
    of more than ``GEMV_MAX_ROWS`` rows outside autograd and compilation, where the many-row
    products run on the kernel's GEMM (OpenBLAS chosen, kernel built with AVX-512).
    ``silu(g) = g / (1 + e^-g)`` with the decode step's exponential (vec_math.h, within 2 ulp),
    so it agrees with the torch ops to fp32 rounding.

    Example::

        act = quant_swiglu(x, gate_up)  # gate_up: QuantWeight [2 * I, H]; x [T, H]
        if act is None:
            gate, up = quant_linear(x, gate_up).chunk(2, dim=-1)
            act = F.silu(gate) * up
    """
    _check(x, weight, None)
    if weight.rows % 2:
        raise ValueError(f"weight: expected an even number of rows (gate, up), got {weight.rows}")
    if (
        torch.compiler.is_compiling()
        or (torch.is_grad_enabled() and x.requires_grad)
        or x.device.type != "cpu"
        or x.dtype != torch.float32
    ):
        return None
    flat = x.reshape(-1, weight.cols)
    kernel = _cpu_kernel_ready()
    if flat.shape[0] <= GEMV_MAX_ROWS or kernel is None:
        return None
    if default_dense_gemm().in_region_sgemm() is None:  # MKL's side: not measured there
        return None
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    y = kernel.gated(flat, weight.data.contiguous(), QuantType(weight.qtype), weight.cols)
    return None if y is None else y.view(*x.shape[:-1], weight.rows // 2)


def dequantize(weight: QuantWeight) -> torch.Tensor:
    """fp32 values ``[rows, cols]`` of ``weight``, bit-identical to ``gguf.quants.dequantize``."""
    if not isinstance(weight, QuantWeight):
        raise TypeError(f"weight: expected a QuantWeight, got {type(weight).__name__}")
    fn = eager_or_op(dequantize_op, dequantize_impl)
    out: torch.Tensor = fn(weight.data, int(quant_type(weight.qtype)), weight.cols)
    return out


def dequantize_rows(weight: QuantWeight, ids: torch.Tensor) -> torch.Tensor:
    """fp32 ``[*ids.shape, cols]``: rows ``ids`` of ``weight``'s values, ``dequantize(weight)[ids]``
    bit for bit, dequantising only those rows (a token-embedding lookup).

    On the CPU with the C kernel, up to ``GEMV_MAX_ROWS`` ids (a decode step's) run one C call
    per row at its offset in the bytes: no gather of the bytes and no op dispatch; more ids
    gather their bytes and dequantise them in one call. Ids out of ``[0, rows)`` raise a
    ``ValueError`` naming ``ids``.
    """
    if not isinstance(weight, QuantWeight):
        raise TypeError(f"weight: expected a QuantWeight, got {type(weight).__name__}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"ids: expected an integer tensor, got {ids.dtype}")
    flat = ids.reshape(-1)
    count, data = flat.numel(), weight.data
    short = count <= GEMV_MAX_ROWS
    values: list[int] = []
    if count:
        if short:
            values = flat.tolist()
            low, high = min(values), max(values)
        else:
            low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= weight.rows:
            raise ValueError(f"ids: expected ids in [0, {weight.rows}), got {low}..{high}")
    if (
        short
        and data.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and (kernel := _cpu_kernel_ready()) is not None
    ):
        out = kernel.dequantize_rows(data, values, weight.qtype, weight.cols)
    else:
        rows = data.index_select(0, flat.to(data.device))
        out = dequantize(QuantWeight(rows, weight.qtype, weight.cols))
    return out.view(*ids.shape, weight.cols)
