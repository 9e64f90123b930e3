"""Which BLAS runs the many-row (prefill) GEMM, decided without torch.

One rule for both runtimes: the engine's :class:`~deepinfer_kernels.quant.dense_gemm.DenseGemm`
(torch) and the lean runtime's :meth:`~deepinfer_kernels.cpu.numpy_ops.NumpyKernels.linear`
(numpy) both ask :class:`BlasChoice`. ``auto`` takes numpy's OpenBLAS when numpy links one that
threadpoolctl can find and the CPU is not Intel's (MKL takes its slower non-Intel dispatch on
AMD: see ``dense_gemm``'s module docstring for the figures); else MKL, which in a torch-free
process means "no sgemm: keep the block kernels". ``DEEPINFER_DENSE_GEMM=auto|mkl|openblas``
overrides the rule for the process.

:class:`SingleThreadSgemm` is OpenBLAS's ILP64 ``cblas_sgemm`` as an address for the C entry
``deepinfer_quant_linear_sgemm`` (each OpenMP thread multiplies its own share of the weight's
rows on it), and a context that holds OpenBLAS to one thread around such calls.

Example::

    from deepinfer_kernels.quant.blas_choice import default_blas_choice

    sgemm = default_blas_choice().in_region_sgemm()  # None: MKL's rule, use the block kernels
    if sgemm is not None:
        with sgemm.one_thread() as address:
            ...  # NumpyKernels().linear(x, w, sgemm=address)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy  # noqa: F401  (loads numpy's BLAS, which threadpoolctl then finds)

Backend = Literal["mkl", "openblas"]
BACKENDS: tuple[str, ...] = ("auto", "mkl", "openblas")
ENV = "DEEPINFER_DENSE_GEMM"


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


def openblas_controller() -> Any | None:
    """threadpoolctl's handle of the OpenBLAS numpy links (None: numpy uses another BLAS, or
    threadpoolctl is not installed)."""
    try:
        from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]
    except ImportError:  # the optional ``blas`` extra; without it, MKL / block kernels (exact)
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
    (``deepinfer_quant_linear_sgemm``), and a context that holds OpenBLAS to one thread
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


@dataclass(frozen=True)
class BlasChoice:
    """The BLAS of a many-row product at one thread (``one``) and at several (``many``), the
    OpenBLAS controller when numpy has one, and the in-region sgemm when ``one`` is OpenBLAS
    and it exports an ILP64 CBLAS. Build it with :meth:`resolve`."""

    one: Backend
    many: Backend
    controller: Any | None
    sgemm: SingleThreadSgemm | None

    @classmethod
    def resolve(cls, backend: str = "auto", vendor: str | None = None) -> BlasChoice:
        """The choice for ``backend`` (``auto``, ``mkl`` or ``openblas``; see the module doc)
        on a CPU of ``vendor`` (None: read ``/proc/cpuinfo``). ``openblas`` on a numpy without
        OpenBLAS raises ``ValueError``."""
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        controller = None if backend == "mkl" else openblas_controller()
        if backend == "openblas" and controller is None:
            raise ValueError("backend: 'openblas' requested, but numpy's BLAS is not OpenBLAS")
        one: Backend
        many: Backend
        if backend == "auto":
            intel = (cpu_vendor() if vendor is None else vendor) == "GenuineIntel"
            one = "openblas" if controller is not None and not intel else "mkl"
            # numpy's matmul at several threads stays on MKL: MKL runs on torch's own OpenMP
            # pool, while OpenBLAS brings a second pool whose threads and torch's spinning
            # ones contend for the cores (2 threads, loaded: 1.15-1.6x the CPU).
            many = "mkl"
        else:
            one = many = "mkl" if backend == "mkl" else "openblas"
        # The in-region path (each OpenMP thread runs its share on a one-thread sgemm) has no
        # second pool, so it takes OpenBLAS at every thread count where one thread does.
        sgemm = SingleThreadSgemm.find(controller) if one == "openblas" else None
        return cls(one, many, controller, sgemm)

    def in_region_sgemm(self) -> SingleThreadSgemm | None:
        """The sgemm for ``deepinfer_quant_linear_sgemm`` (OpenBLAS chosen and exporting an
        ILP64 CBLAS), or None: then the GEMM stays on MKL (engine) or the block kernels
        (lean runtime)."""
        return self.sgemm


@functools.lru_cache(maxsize=1)
def default_blas_choice() -> BlasChoice:
    """The process's choice, made once on first use from ``DEEPINFER_DENSE_GEMM`` (``auto``,
    ``mkl`` or ``openblas``; unset means ``auto``)."""
    return BlasChoice.resolve(os.environ.get(ENV, "auto") or "auto")
