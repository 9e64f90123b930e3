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

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

Backend = Literal["mkl", "openblas"]
BACKENDS: tuple[str, ...] = ("auto", "mkl", "openblas")


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's ``vendor_id`` (e.g. ``GenuineIntel``, ``AuthenticAMD``), or "" when unknown."""
    try:
        with cpuinfo.open(encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _openblas_controller() -> Any | None:
    """threadpoolctl's handle of the OpenBLAS numpy links (None: numpy uses another BLAS)."""
    try:
        from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]
    except ImportError:  # a dependency of deepinfer-kernels; without it, MKL (still exact)
        return None
    # numpy must be loaded for threadpoolctl to see its BLAS (it is: imported above). scipy
    # may load an OpenBLAS of its own: numpy's is the one whose path names numpy.
    found = ThreadpoolController().select(internal_api="openblas").lib_controllers
    ours = [c for c in found if "numpy" in str(c.filepath)]
    if ours or len(found) == 1:
        return (ours or found)[0]
    return None


class SingleThreadSgemm:
    """numpy's OpenBLAS ILP64 ``cblas_sgemm`` as an address for C callers
    (``QuantGemvKernel.linear(sgemm=...)``), and a context that holds OpenBLAS to one thread
    around such calls (each caller thread runs its own share)."""

    # ILP64 names only: the C side passes 64-bit integers.
    NAMES = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")

    def __init__(self, controller: Any) -> None:
        lib = controller.dynlib
        prefix = "scipy_" if hasattr(lib, "scipy_cblas_sgemm64_") else ""
        self.address: int = (
            ctypes.cast(
                next(getattr(lib, n) for n in self.NAMES if hasattr(lib, n)), ctypes.c_void_p
            ).value
            or 0
        )
        self._get = getattr(lib, f"{prefix}openblas_get_num_threads64_")
        self._set = getattr(lib, f"{prefix}openblas_set_num_threads64_")
        self._get.restype, self._get.argtypes = ctypes.c_int, []
        self._set.restype, self._set.argtypes = None, [ctypes.c_int]

    @classmethod
    def find(cls, controller: Any | None) -> SingleThreadSgemm | None:
        """The sgemm of ``controller``'s library, or None when it exports no ILP64 CBLAS."""
        if controller is None:
            return None
        lib = controller.dynlib
        if not any(hasattr(lib, n) for n in cls.NAMES):
            return None
        try:
            found = cls(controller)
        except AttributeError:  # no thread-count symbols of the same naming
            return None
        return found if found.address else None

    @contextlib.contextmanager
    def one_thread(self) -> Iterator[int]:
        """OpenBLAS at one thread inside (process-wide), its previous count restored after."""
        before = self._get()
        if before != 1:
            self._set(1)
        try:
            yield self.address
        finally:
            if before != 1:
                self._set(before)


class DenseGemm:
    """``y = x W^T (+ b)`` for fp32 CPU tensors ``x [T, K]`` and ``w [N, K]``, on ``backend``.

    Example::

        gemm = DenseGemm("openblas")  # or "mkl", or "auto" (see the module docstring)
        y = gemm(torch.randn(300, 576), torch.randn(960, 576), None)  # [300, 960]

    ``backend="openblas"`` on a numpy without OpenBLAS raises ``ValueError``; an explicit
    backend runs at every thread count."""

    def __init__(self, backend: str = "auto", vendor: str | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        self._openblas = None if backend == "mkl" else _openblas_controller()
        if backend == "openblas" and self._openblas is None:
            raise ValueError("backend: 'openblas' requested, but numpy's BLAS is not OpenBLAS")
        one: Backend
        many: Backend
        if backend == "auto":
            intel = (cpu_vendor() if vendor is None else vendor) == "GenuineIntel"
            one = "openblas" if self._openblas is not None and not intel else "mkl"
            # numpy's matmul at several threads stays on MKL: MKL runs on torch's own OpenMP
            # pool, while OpenBLAS brings a second pool whose threads and torch's spinning
            # ones contend for the cores (2 threads, loaded: 1.15-1.6x the CPU).
            many = "mkl"
        else:
            one = many = "mkl" if backend == "mkl" else "openblas"
        self._choice: dict[bool, Backend] = {True: one, False: many}
        # The in-region path (each torch thread runs its share on a one-thread sgemm) has no
        # second pool, so it takes OpenBLAS at every thread count where one thread does.
        self.sgemm = SingleThreadSgemm.find(self._openblas) if one == "openblas" else None

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
    return DenseGemm(os.environ.get("DEEPINFER_DENSE_GEMM", "auto") or "auto")
