"""The GEMM behind many-row block-format products: ``x [T, K]`` times a dequantised ``W [N, K]``.

A prefill step (more than ``GEMV_MAX_ROWS`` rows) dequantises each weight once and spends most
of its time in one fp32 GEMM per projection. Which BLAS runs that GEMM matters:

* torch's MKL takes its non-Intel dispatch on AMD CPUs (``mkl_blas_def_sgemm_kernel_0_zen``
  in a profile). On a 2-core AMD EPYC (Zen 3), one thread, its sgemm reached 49-68 GFLOP/s on
  SmolLM2's prefill shapes, numpy's OpenBLAS (Haswell kernels) 59-75 (1.20x the speed).
* On Intel CPUs MKL's own kernels are the reference point, so MKL stays there.

``quant_linear`` runs OpenBLAS inside torch's own OpenMP region
(:class:`SingleThreadSgemm`, ``QuantGemvKernel.linear(sgemm=...)``): each thread dequantises its
share of ``W``'s rows and multiplies all of ``x`` by it on a one-thread ``cblas_sgemm``. So
there is no second thread pool (numpy's OpenBLAS next to torch's OpenMP pool used 1.15-1.6x
the CPU of MKL at 2 threads), and each share is multiplied while still in cache: at 2 threads
the prefill shapes ran 1.61x (1.32-1.92) MKL's speed (loaded). :class:`DenseGemm`'s own call
(a dense ``W``, numpy's matmul) takes OpenBLAS at one thread only, for that reason.

Both compute the same fp32 products of the same exact weights; they differ only in summation
order (results agree to fp32 rounding, as any two BLAS calls do). The choice is fixed per
process (``auto``: OpenBLAS when numpy's BLAS is OpenBLAS and the CPU is not Intel's;
``DEEPINFER_DENSE_GEMM=mkl|openblas`` overrides it), so a run's numerics do not depend on
timing. Finding numpy's OpenBLAS and its thread limit needs threadpoolctl (the ``blas`` extra,
installed by ``make setup``); without it the GEMM stays on MKL.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch
import torch.nn.functional as F

# The backend rule, OpenBLAS discovery and the sgemm address are torch-free (the lean runtime
# uses them too): one rule, in blas_choice. Re-exported here for the engine's callers.
from deepinfer_kernels.quant.blas_choice import (
    BACKENDS,
    ENV,
    Backend,
    BlasChoice,
    SingleThreadSgemm,
    cpu_vendor,
    openblas_controller,
)

__all__ = [
    "BACKENDS",
    "Backend",
    "BlasChoice",
    "DenseGemm",
    "SingleThreadSgemm",
    "cpu_vendor",
    "default_dense_gemm",
    "openblas_controller",
]


class DenseGemm:
    """``y = x W^T (+ b)`` for fp32 CPU tensors ``x [T, K]`` and ``w [N, K]``, on ``backend``.

    Example::

        gemm = DenseGemm("openblas")  # or "mkl", or "auto" (see the module docstring)
        y = gemm(torch.randn(300, 576), torch.randn(960, 576), None)  # [300, 960]

    ``backend="openblas"`` on a numpy without OpenBLAS raises ``ValueError``; an explicit
    backend runs at every thread count."""

    def __init__(self, backend: str = "auto", vendor: str | None = None) -> None:
        choice = BlasChoice.resolve(backend, vendor)  # raises ValueError naming backend
        self._openblas = choice.controller
        self._choice: dict[bool, Backend] = {True: choice.one, False: choice.many}
        self.sgemm = choice.sgemm

    def in_region_sgemm(self) -> SingleThreadSgemm | None:
        """The sgemm for ``QuantGemvKernel.linear(sgemm=...)`` (OpenBLAS chosen and exporting an
        ILP64 CBLAS), or None: then dequantise and call this object."""
        return self.sgemm

    def backend_for(self, threads: int) -> Backend:
        """The BLAS a call runs on with ``threads`` torch intra-op threads."""
        return self._choice[threads <= 1]

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.backend_for(torch.get_num_threads()) == "openblas":
            return self._openblas_gemm(x, w, bias)
        return F.linear(x, w, bias)

    def _openblas_gemm(
        self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        # Read back each call (0.6 us): the limit is process-wide, and another DenseGemm or
        # library may have moved it since.
        threads = torch.get_num_threads()
        if self._openblas.get_num_threads() != threads:  # type: ignore[union-attr]
            self._openblas.set_num_threads(threads)  # type: ignore[union-attr]
        flat = x.detach().reshape(-1, x.shape[-1])
        if not flat.is_contiguous():
            flat = flat.contiguous()
        y = torch.empty(flat.shape[0], w.shape[0], dtype=torch.float32)
        # numpy hands W^T to sgemm as a transposed view (no copy) and writes y in place.
        np.matmul(flat.numpy(), w.detach().contiguous().numpy().T, out=y.numpy())
        if bias is not None:
            y += bias
        return y.view(*x.shape[:-1], w.shape[0])


@functools.lru_cache(maxsize=1)
def default_dense_gemm() -> DenseGemm:
    """The process's many-row GEMM, chosen once on first use: ``DEEPINFER_DENSE_GEMM``
    (``auto``, ``mkl`` or ``openblas``; unset means ``auto``)."""
    return DenseGemm(os.environ.get(ENV, "auto") or "auto")
