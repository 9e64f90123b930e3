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

``torch.ops.deepinfer.quant_linear``, ``dequantize``, ``quant_swiglu`` and ``dequantize_rows``
are registered with fakes, so they trace under ``torch.compile``; eager calls run their bodies
directly (see :func:`~deepinfer_kernels._dispatch.eager_or_op`: the dispatcher's round trip
would be the whole cost of a decode step's embedding lookup).
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


def _fused_swiglu(
    x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int
) -> torch.Tensor | None:
    """The fused C pass of :func:`quant_swiglu`, or None where it does not apply (not fp32 CPU
    ``x``, at most ``GEMV_MAX_ROWS`` rows, no kernel, MKL chosen, no AVX-512)."""
    if x.numel() <= GEMV_MAX_ROWS * cols or x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    flat = x.reshape(-1, cols)
    kernel = _cpu_kernel_ready()
    if kernel is None:
        return None
    if default_dense_gemm().in_region_sgemm() is None:  # MKL's side: not measured there
        return None
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    y = kernel.gated(flat, data.contiguous(), QuantType(qtype), cols)
    return None if y is None else y.view(*x.shape[:-1], data.shape[0] // 2)


def quant_swiglu_impl(
    x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int, use_triton: bool
) -> torch.Tensor:
    """The op's body: the fused pass where it applies, else the product then ``silu(g) * u``
    (what :func:`quant_swiglu`'s callers run when it returns None), so the op always answers."""
    y = None if use_triton else _fused_swiglu(x, data, qtype, cols)
    if y is not None:
        return y
    gate, up = quant_linear_impl(x, data, qtype, cols, None, use_triton).chunk(2, dim=-1)
    return F.silu(gate) * up


quant_swiglu_op = torch.library.custom_op(
    "deepinfer::quant_swiglu", quant_swiglu_impl, mutates_args=()
)


@quant_swiglu_op.register_fake
def _(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int, use_triton: bool) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], data.shape[0] // 2)


def quant_swiglu(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor | None:
    """``silu(x Wg^T) * (x Wu^T)`` ``[..., rows / 2]`` for a gate-and-up ``weight`` (the gate's
    rows, then the up's, one format), in one pass of the compiled AVX-512 GEMM
    (``quant/csrc/gguf_zmm_gemm.h``: no ``[T, rows]`` product in memory, no separate silu
    and mul), or None where that path does not apply: then compute it as ``gate, up =
    quant_linear(x, weight).chunk(2, -1); F.silu(gate) * up``. It applies to fp32 CPU ``x``
    of more than ``GEMV_MAX_ROWS`` rows outside autograd, where the many-row products run on
    the kernel's GEMM (OpenBLAS chosen, kernel built with AVX-512).
    ``silu(g) = g / (1 + e^-g)`` with the decode step's exponential (vec_math.h, within 2 ulp),
    so it agrees with the torch ops to fp32 rounding.

    Under ``torch.compile`` (outside autograd) it returns ``torch.ops.deepinfer.quant_swiglu``,
    never None: the op runs the fused pass where it applies at run time and the product then
    silu and mul elsewhere, so the graph need not know the row count or the build.

    Example::

        act = quant_swiglu(x, gate_up)  # gate_up: QuantWeight [2 * I, H]; x [T, H]
        if act is None:
            gate, up = quant_linear(x, gate_up).chunk(2, dim=-1)
            act = F.silu(gate) * up
    """
    _check(x, weight, None)
    if weight.rows % 2:
        raise ValueError(f"weight: expected an even number of rows (gate, up), got {weight.rows}")
    if torch.is_grad_enabled() and x.requires_grad:  # the op has no backward
        return None
    if torch.compiler.is_compiling():
        triton = should_use_triton(x.device)
        out: torch.Tensor = quant_swiglu_op(x, weight.data, int(weight.qtype), weight.cols, triton)
        return out
    if x.numel() <= GEMV_MAX_ROWS * weight.cols:  # a decode step's rows, every layer: answer first
        return None
    return _fused_swiglu(x, weight.data, weight.qtype, weight.cols)


def dequantize(weight: QuantWeight) -> torch.Tensor:
    """fp32 values ``[rows, cols]`` of ``weight``, bit-identical to ``gguf.quants.dequantize``."""
    if not isinstance(weight, QuantWeight):
        raise TypeError(f"weight: expected a QuantWeight, got {type(weight).__name__}")
    fn = eager_or_op(dequantize_op, dequantize_impl)
    out: torch.Tensor = fn(weight.data, int(quant_type(weight.qtype)), weight.cols)
    return out


def dequantize_rows_impl(
    data: torch.Tensor, ids: torch.Tensor, qtype: int, cols: int
) -> torch.Tensor:
    """The op's body (``ids`` already checked integer): ids out of range raise here, where
    their values are known (under ``torch.compile`` too)."""
    flat = ids.reshape(-1)
    count = flat.numel()
    short = count <= GEMV_MAX_ROWS
    values: list[int] = []
    if count:
        if short:
            values = flat.tolist()
            low, high = min(values), max(values)
        else:
            low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= data.shape[0]:
            raise ValueError(f"ids: expected ids in [0, {data.shape[0]}), got {low}..{high}")
    if short and data.device.type == "cpu" and (kernel := _cpu_kernel_ready()) is not None:
        out = kernel.dequantize_rows(data, values, qtype, cols)
    else:
        out = dequantize_impl(data.index_select(0, flat.to(data.device)), qtype, cols)
    return out.view(*ids.shape, cols)


dequantize_rows_op = torch.library.custom_op(
    "deepinfer::dequantize_rows", dequantize_rows_impl, mutates_args=()
)


@dequantize_rows_op.register_fake
def _(data: torch.Tensor, ids: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    return data.new_empty(*ids.shape, cols, dtype=torch.float32)


def dequantize_rows(weight: QuantWeight, ids: torch.Tensor) -> torch.Tensor:
    """fp32 ``[*ids.shape, cols]``: rows ``ids`` of ``weight``'s values, ``dequantize(weight)[ids]``
    bit for bit, dequantising only those rows (a token-embedding lookup).

    On the CPU with the C kernel, up to ``GEMV_MAX_ROWS`` ids (a decode step's) run one C call
    per row at its offset in the bytes: no gather of the bytes and no op dispatch; more ids
    gather their bytes and dequantise them in one call. Ids out of ``[0, rows)`` raise a
    ``ValueError`` naming ``ids``. Under ``torch.compile`` it is
    ``torch.ops.deepinfer.dequantize_rows`` (same body).
    """
    if not isinstance(weight, QuantWeight):
        raise TypeError(f"weight: expected a QuantWeight, got {type(weight).__name__}")
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        got = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"ids: expected an integer tensor, got {got}")
    # A decode step's lookup costs ~8 us eagerly: the dispatcher would add ~4.5 more
    # (benchmarks/quant_op_dispatch.py), so the op is for tracing only (eager_or_op's rule).
    if torch.compiler.is_compiling():
        out: torch.Tensor = dequantize_rows_op(weight.data, ids, int(weight.qtype), weight.cols)
        return out
    return dequantize_rows_impl(weight.data, ids, weight.qtype, weight.cols)
