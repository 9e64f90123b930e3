"""``linear(x, w, b) = x W^T + b`` on the fastest exact fp32 product this CPU offers.

Two measured facts about fp32 projections with few rows (a decode batch, a speculative
verification, a short prefill chunk) on an x86 CPU (``benchmarks/model_runner_linear.py``
prints the sweep; ``benchmarks/results/model_runner_linear.md`` holds the table):

* MKL's ``x @ W^T`` with a row-major ``W`` ``[out, in]`` runs a kernel 2-3x slower than the
  mathematically identical ``(W @ x^T)^T`` for about 4 to 48 rows.
* Faster still is MKL's packed GEMM: ``cblas_sgemm_pack`` lays ``W`` out once in the order its
  micro-kernel reads, and ``cblas_sgemm_compute`` then streams it. torch exposes the pair as
  ``torch.ops.mkl._mkl_reorder_linear_weight`` / ``torch.ops.mkl._mkl_linear`` (what
  ``torch.compile`` uses for frozen CPU linears). All 121 SmolLM2-135M projections of a 16-row
  step took 43-52 ms packed vs 63-81 ms transposed vs 141-144 ms plain in two sweeps.

:class:`PackedWeight` keeps the packed copy next to a weight (rebuilt whenever the weight is
replaced or modified in place); :func:`linear` uses it for CPU fp32 products without autograd,
else the transposed product for the row counts where that wins, else ``F.linear``. Every path
computes the same fp32 dot products; results agree with ``F.linear`` to fp32 rounding, not
bitwise. The packed copy costs one more copy of the weight in memory.

Fewer rows than that are bound by reading the weights. For weights that are exactly bf16 values
(a bf16 checkpoint run in fp32, like the embedded model) :class:`PackedWeight` also keeps their
bf16 panels, and up to ``BF16_MAX_ROWS`` rows run on
:class:`~deepinfer_kernels.cpu.bf16_weight_linear.Bf16WeightLinear`, which reads half the bytes and
computes in fp32 (1.6x faster than ``F.linear`` for all one-row products of a SmolLM2 step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_kernels.cpu.bf16_weight_linear import Bf16WeightLinear, bf16_panels

# Row counts for which ``W @ x^T`` beats ``x @ W^T`` on CPU when packing is unavailable.
CPU_TRANSPOSED_ROWS = range(4, 49)
# Row count the weights are packed for. Any row count can use the packed copy; packing for 256
# was the fastest or within noise of it from 1 to 512 rows in the sweep (packing for 1 row
# made 16-row products 1.5x slower).
PACK_ROWS_HINT = 256
# Fewer rows stay on ``F.linear`` (MKL's GEMV for one row): for one row the packed kernel was
# ~15% slower inside whole decode steps (1.54 s vs 1.86 s for 32 tokens, medians of 5), for 2-3
# rows the two were within run-to-run noise of each other; from 4 to 48 rows packing was
# 1.5-3.3x faster than ``F.linear``, and 1.0-1.5x from 64 to 512 rows.
PACKED_MIN_ROWS = 4
# Up to this many rows, bf16-exact weights run on the bf16-weight kernel (when it is built):
# over all SmolLM2 projections it took 15 ms for 1 row, 27 ms for 16 and 42 ms for 32 rows,
# against 25 ms for ``F.linear`` and 43 and 53 ms on the packed GEMM; at 48 rows the packed GEMM
# won (``benchmarks/results/model_runner_linear.md``).
BF16_MAX_ROWS = 32


def mkl_packing_available() -> bool:
    """Whether this torch build has MKL's packed fp32 GEMM (x86 CPU builds do)."""
    return bool(torch._C.has_mkl) and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedWeight:
    """The prepared copies of one fp32 CPU weight ``[out, in]``, each made on first use: the
    MKL-packed copy (:meth:`get`) and, when every value is exactly a bf16 value, its bf16
    panels (:meth:`bf16`) for ``kernel``.

    Both are rebuilt when the weight they are asked for is a different tensor, has new storage,
    or was modified in place (its version counter moved), so a reloaded or re-initialised weight
    is never served stale. The weight last prepared is held, so its address cannot be reused by
    another tensor while the copies are kept.
    """

    def __init__(self, kernel: Bf16WeightLinear | None = None) -> None:
        self.kernel = kernel
        self._source: torch.Tensor | None = None
        self._key: tuple[int, int] = (0, -1)
        self._packed: torch.Tensor | None = None
        self._bf16: torch.Tensor | None = None
        self._bf16_checked = False

    @staticmethod
    def _key_of(weight: torch.Tensor) -> tuple[int, int]:
        # Inference tensors have no version counter (and cannot be modified outside
        # inference mode); their storage pointer is the whole key.
        version = 0 if weight.is_inference() else weight._version
        return weight.data_ptr(), version

    def _follow(self, weight: torch.Tensor) -> None:
        key = self._key_of(weight)
        if self._source is not weight or self._key != key:
            self.clear()
            self._source, self._key = weight, key

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        """The MKL-packed copy of ``weight``."""
        self._follow(weight)
        if self._packed is None:
            with torch.no_grad():
                self._packed = torch.ops.mkl._mkl_reorder_linear_weight(
                    weight.detach(), PACK_ROWS_HINT
                )
        return self._packed

    def bf16(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``weight``'s bf16 panels when it is bf16-exact (checked once per weight), else None."""
        self._follow(weight)
        if not self._bf16_checked:
            self._bf16, self._bf16_checked = bf16_panels(weight), True
        return self._bf16

    @property
    def is_packed(self) -> bool:
        """Whether a packed copy is held."""
        return self._packed is not None

    @property
    def has_bf16(self) -> bool:
        """Whether bf16 panels are held (the weight was bf16-exact and the kernel asked)."""
        return self._bf16 is not None

    def clear(self) -> None:
        """Drop the copies (and the reference to their weight)."""
        self._source, self._key = None, (0, -1)
        self._packed, self._bf16, self._bf16_checked = None, None, False


def _cpu_fp32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    contiguous: bool = True,
    pack: PackedWeight | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x`` ``[..., in]``, ``weight`` ``[out, in]``.

    ``pack``: the weight's :class:`PackedWeight`. When autograd is off (neither kernel has a
    backward), CPU fp32 products of up to ``BF16_MAX_ROWS`` rows run on ``pack.kernel`` if the
    weight is bf16-exact and the kernel is built, and products of at least ``PACKED_MIN_ROWS``
    rows run on the MKL-packed copy where MKL packing is available.

    ``contiguous=False``: for 2-d ``x`` on the transposed path the result may be the
    transposed view of ``W x^T`` (no copy). Element-wise consumers and a following ``linear``
    take it as it is.
    """
    if not _cpu_fp32(x, weight) or torch.compiler.is_compiling():
        # The compiler plans its own products (and cannot trace the prepared copies).
        return F.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (
        pack is not None
        and pack.kernel is not None
        and 0 < rows <= BF16_MAX_ROWS
        and weight.dim() == 2
        and not torch.is_grad_enabled()
        and (bias is None or bias.dtype == torch.float32)
        and pack.kernel.available()
        and (panels := pack.bf16(weight)) is not None
    ):
        y = pack.kernel(x.reshape(rows, x.shape[-1]), panels, weight.shape[0], bias)
        return y.view(*x.shape[:-1], weight.shape[0])
    if (
        pack is not None
        and rows >= PACKED_MIN_ROWS
        and weight.dim() == 2
        and not torch.is_grad_enabled()
        and mkl_packing_available()
        and (bias is None or bias.dtype == torch.float32)
    ):
        flat = x.reshape(rows, x.shape[-1])
        out: torch.Tensor = torch.ops.mkl._mkl_linear(flat, pack.get(weight), weight, bias, rows)
        return out.view(*x.shape[:-1], weight.shape[0])
    if rows not in CPU_TRANSPOSED_ROWS:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    out = torch.mm(weight, flat.t()).t()
    if bias is not None:
        out = out + bias
    if not contiguous and x.dim() == 2:
        return out
    # Contiguous so that callers can ``view`` the result as with ``F.linear``.
    return out.contiguous().view(*x.shape[:-1], weight.shape[0])
