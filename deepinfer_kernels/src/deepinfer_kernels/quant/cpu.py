"""The compiled CPU kernel for block-format weights (``csrc/quant_gemv.c``).

Built on first use with the machine's C compiler through
:func:`deepinfer_kernels.cpu.build_library` (cached, keyed on source, compiler, flags and CPU;
OpenMP on torch's thread pool). ``DEEPINFER_CPU_KERNELS=0`` turns it off; where it cannot be
built it warns once and reports itself unavailable, and the op runs the torch reference.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from deepinfer_kernels.quant.formats import QuantType, row_bytes

SOURCE = Path(__file__).parent / "csrc" / "quant_gemv.c"
ABI = (
    "4|deepinfer_quant_linear(piipiiiipp)i|deepinfer_quant_dequantize(piiip)i"
    "|deepinfer_quant_linear_sgemm(ppiipiiiipp)i|deepinfer_quant_gated(piipiiiip)i"
    "|deepinfer_quant_linear_blas(ppiipiiiipp)i|deepinfer_quant_own_gemm()i"
)
_P, _I = ctypes.c_void_p, ctypes.c_int64


class QuantGemvKernel:
    """Build-on-first-use handle of ``quant_gemv.c`` (one per process is enough: it holds no
    per-call state). ``enabled=None`` reads ``DEEPINFER_CPU_KERNELS``."""

    def __init__(self, cache_dir: Path | None = None, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = os.environ.get("DEEPINFER_CPU_KERNELS", "1") != "0"
        self.enabled = enabled
        self.cache_dir = cache_dir
        self.error: str | None = None
        self._lib: Any = None
        self._lock = threading.Lock()

    def available(self) -> bool:
        """Whether the kernel runs here (builds and loads it on the first call)."""
        if not self.enabled:
            return False
        if self._lib is None and self.error is None:
            with self._lock:
                if self._lib is None and self.error is None:
                    self._load()
        return self._lib is not None

    def _load(self) -> None:
        from deepinfer_kernels.cpu import NativeBuildError, build_library

        try:
            lib = ctypes.CDLL(str(build_library(SOURCE, self.cache_dir)))
        except (NativeBuildError, OSError) as exc:
            self.error = str(exc)
            warnings.warn(
                f"deepinfer's quantised CPU kernel is unavailable, using torch: {exc}",
                RuntimeWarning,
                stacklevel=4,
            )
            return
        abi = lib.deepinfer_abi_quant_gemv
        abi.argtypes, abi.restype = [], ctypes.c_char_p
        got = abi()
        if got is None or got.decode() != ABI:
            # A wrong argument table would corrupt memory: never run on a mismatch.
            raise RuntimeError(f"{SOURCE.name}: library ABI {got!r} differs from {ABI!r}")
        lib.deepinfer_quant_linear.argtypes = [_P, _I, _I, _P, _I, _I, _I, _I, _P, _P]
        lib.deepinfer_quant_linear.restype = ctypes.c_int
        lib.deepinfer_quant_dequantize.argtypes = [_P, _I, _I, _I, _P]
        lib.deepinfer_quant_dequantize.restype = ctypes.c_int
        lib.deepinfer_quant_linear_sgemm.argtypes = [_P, _P, _I, _I, _P, _I, _I, _I, _I, _P, _P]
        lib.deepinfer_quant_linear_sgemm.restype = ctypes.c_int
        lib.deepinfer_quant_gated.argtypes = [_P, _I, _I, _P, _I, _I, _I, _I, _P]
        lib.deepinfer_quant_gated.restype = ctypes.c_int
        lib.deepinfer_quant_linear_blas.argtypes = lib.deepinfer_quant_linear_sgemm.argtypes
        lib.deepinfer_quant_linear_blas.restype = ctypes.c_int
        lib.deepinfer_quant_own_gemm.argtypes, lib.deepinfer_quant_own_gemm.restype = (
            [],
            ctypes.c_int,
        )
        self._lib = lib

    def own_gemm(self) -> bool:
        """Whether ``linear(sgemm=...)`` runs the kernel's own many-row GEMM
        (``gguf_zmm_gemm.h``: built with AVX-512) rather than the given sgemm."""
        if not self.available():
            raise RuntimeError(f"the quantised CPU kernel is unavailable: {self.error}")
        return bool(self._lib.deepinfer_quant_own_gemm())

    def linear(
        self,
        x: torch.Tensor,
        data: torch.Tensor,
        qtype: QuantType,
        cols: int,
        bias: torch.Tensor | None,
        sgemm: int | None = None,
        *,
        force_sgemm: bool = False,
    ) -> torch.Tensor:
        """``x [M, K] @ W^T + bias`` for contiguous fp32 CPU ``x`` rows and uint8 ``data``
        (operands already validated by the op). With ``sgemm``, the address of a
        single-threaded ILP64 ``cblas_sgemm`` (see ``quant.dense_gemm``), many rows run on it:
        each OpenMP thread dequantises its share of ``W``'s rows and multiplies all of ``x``
        by it; except where the kernel has its own GEMM (:meth:`own_gemm`, AVX-512), which
        runs instead unless ``force_sgemm`` (the path it replaced: tests compare the two; the
        engine never sets it)."""
        if not self.available():
            raise RuntimeError(f"the quantised CPU kernel is unavailable: {self.error}")
        rows, n = x.shape[0], data.shape[0]
        y = torch.empty(rows, n, dtype=torch.float32)
        args = (
            x.data_ptr(), rows, x.stride(0), data.data_ptr(), n, cols,
            row_bytes(qtype, cols), int(qtype),
            None if bias is None else bias.data_ptr(), y.data_ptr(),
        )  # fmt: skip
        if sgemm is None:
            if force_sgemm:
                raise ValueError("force_sgemm: needs an sgemm address")
            name, rc = "deepinfer_quant_linear", self._lib.deepinfer_quant_linear(*args)
        elif force_sgemm:
            name = "deepinfer_quant_linear_blas"
            rc = self._lib.deepinfer_quant_linear_blas(sgemm, *args)
        else:
            name = "deepinfer_quant_linear_sgemm"
            rc = self._lib.deepinfer_quant_linear_sgemm(sgemm, *args)
        if rc != 0:
            raise RuntimeError(f"{name} failed with code {rc}")
        return y

    def gated(
        self, x: torch.Tensor, data: torch.Tensor, qtype: QuantType, cols: int
    ) -> torch.Tensor | None:
        """``silu(x Wg^T) * (x Wu^T)`` ``[M, I]`` for contiguous-row fp32 CPU ``x [M, cols]``
        and uint8 ``data`` holding ``2 I`` rows (the gate's, then the up's), or None where the
        kernel has no fused path (built without AVX-512): then take the product and the
        activation separately."""
        if not self.available():
            raise RuntimeError(f"the quantised CPU kernel is unavailable: {self.error}")
        rows, n = x.shape[0], data.shape[0]
        if n % 2:
            raise ValueError(f"data: expected an even number of rows (gate and up), got {n}")
        y = torch.empty(rows, n // 2, dtype=torch.float32)
        rc = self._lib.deepinfer_quant_gated(
            x.data_ptr(), rows, x.stride(0), data.data_ptr(), n // 2, cols,
            row_bytes(qtype, cols), int(qtype), y.data_ptr(),
        )  # fmt: skip
        if rc == -3:
            return None
        if rc != 0:
            raise RuntimeError(f"deepinfer_quant_gated failed with code {rc}")
        return y

    def dequantize_rows(
        self, data: torch.Tensor, ids: Sequence[int], qtype: int, cols: int
    ) -> torch.Tensor:
        """fp32 ``[len(ids), cols]``: row ``ids[i]`` of the raw rows ``data`` (CPU,
        contiguous; ids already checked in range), one C call per row at its offset in
        ``data`` (no gathered copy of the bytes; each row's values do not depend on the
        others, so they equal :meth:`dequantize`'s bit for bit)."""
        if not self.available():
            raise RuntimeError(f"the quantised CPU kernel is unavailable: {self.error}")
        out = torch.empty(len(ids), cols, dtype=torch.float32)
        src, dst, stride = data.data_ptr(), out.data_ptr(), data.stride(0)
        fn, kind = self._lib.deepinfer_quant_dequantize, int(qtype)
        for i, row in enumerate(ids):
            rc = fn(src + row * stride, 1, cols, kind, dst + 4 * cols * i)
            if rc != 0:
                raise RuntimeError(f"deepinfer_quant_dequantize failed with code {rc}")
        return out

    def dequantize(self, data: torch.Tensor, qtype: QuantType, cols: int) -> torch.Tensor:
        """fp32 ``[N, cols]`` values of the raw rows ``data`` (CPU, contiguous)."""
        if not self.available():
            raise RuntimeError(f"the quantised CPU kernel is unavailable: {self.error}")
        out = torch.empty(data.shape[0], cols, dtype=torch.float32)
        rc = self._lib.deepinfer_quant_dequantize(
            data.data_ptr(), data.shape[0], cols, int(qtype), out.data_ptr()
        )
        if rc != 0:
            raise RuntimeError(f"deepinfer_quant_dequantize failed with code {rc}")
        return out
