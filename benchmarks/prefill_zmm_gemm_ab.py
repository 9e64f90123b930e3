"""Same-run A/B of the many-row (prefill) block-format product: the kernel's AVX-512 GEMM
(``quant/csrc/gguf_zmm_gemm.h``) against the path it replaced (each thread dequantises its share
of ``W`` and calls numpy's one-thread OpenBLAS sgemm), and of the fused SwiGLU against the
product plus torch's silu and mul.

Both sides are compiled here from the package's headers into throw-away libraries (the
kernels' flags, OpenMP; the sgemm side with ``-DDEEPINFER_NO_ZMM_GEMM``), run on SmolLM2-135M's
projections (QKV 960x576, o 576x576, gate/up 3072x576, down 576x1536) in ``--qtype`` at
``--rows`` rows (1222: the 16-concurrent run's prefill step), alternated ``--repeats`` times,
one thread in the calling thread's CPU time (``--threads N``: wall time). Every side is checked
against a float64 product first. Needs numpy's OpenBLAS (threadpoolctl) and an AVX-512 CPU.

    .venv/bin/python benchmarks/prefill_zmm_gemm_ab.py --rows 1222 --repeats 9
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from deepinfer_kernels.cpu.build import compile_flags
from deepinfer_kernels.quant import QuantType
from deepinfer_kernels.quant.dense_gemm import DenseGemm
from deepinfer_kernels.reference.quant import dequantize_reference
from deepinfer_kernels.testing.quant import random_quant_rows

CSRC = Path(__file__).resolve().parents[1] / "deepinfer_kernels/src/deepinfer_kernels/quant/csrc"
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HARNESS = """
#include <omp.h>
#include "quant_gemv.c"
void ab_threads(int n) { omp_set_num_threads(n); }
int ab_zmm(const float *x, int64_t M, const uint8_t *w, int64_t N, int64_t K, int64_t rb,
           int64_t q, float *y) {
#ifdef ZMM_GEMM
    return zmm_gemm_linear(x, M, K, w, N, K, rb, (int)q, 0, y);
#else
    return -5;
#endif
}
int ab_blas(void *g, const float *x, int64_t M, const uint8_t *w, int64_t N, int64_t K,
            int64_t rb, int64_t q, float *y) {
    return deepinfer_quant_linear_sgemm(g, x, M, K, w, N, K, rb, q, 0, y);
}
int ab_gated(const float *x, int64_t M, const uint8_t *w, int64_t I, int64_t K, int64_t rb,
             int64_t q, float *y) {
    return deepinfer_quant_gated(x, M, K, w, I, K, rb, q, y);
}
"""
_P, _I = ctypes.c_void_p, ctypes.c_int64


def _build(tmp: Path, name: str, defines: list[str], threads: int) -> ctypes.CDLL:
    src, lib = tmp / f"{name}.c", tmp / f"{name}.so"
    src.write_text(HARNESS)
    flags = [*compile_flags(), *defines, "-fopenmp", "-shared", f"-I{CSRC}"]
    subprocess.run(["cc", *flags, str(src), "-o", str(lib)], check=True)
    dll = ctypes.CDLL(str(lib))
    dll.ab_threads.argtypes = [ctypes.c_int]
    dll.ab_threads(threads)
    dll.ab_zmm.argtypes = [_P, _I, _P, _I, _I, _I, _I, _P]
    dll.ab_blas.argtypes = [_P, _P, _I, _P, _I, _I, _I, _I, _P]
    dll.ab_gated.argtypes = [_P, _I, _P, _I, _I, _I, _I, _P]
    return dll


def _show(name: str, base: list[float], new: list[float], flops: float) -> None:
    r = [b / n for b, n in zip(base, new, strict=True)]
    print(
        f"{name}: new {flops / min(new) / 1e9:.1f} GFLOP/s, baseline {flops / min(base) / 1e9:.1f};"
        f" new speed / baseline {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1222)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--qtype", default="Q4_1")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    qtype = QuantType[args.qtype.upper()]
    sgemm = DenseGemm("openblas").in_region_sgemm()
    if sgemm is None:
        raise SystemExit("numpy's OpenBLAS exports no ILP64 cblas_sgemm")
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    rng = np.random.default_rng(0)
    M = args.rows
    with tempfile.TemporaryDirectory() as tmp, sgemm.one_thread() as address:
        new = _build(Path(tmp), "zmm", [], args.threads)
        old = _build(Path(tmp), "sgemm", ["-DDEEPINFER_NO_ZMM_GEMM"], args.threads)
        calls = []
        for n, k in SHAPES:
            w = random_quant_rows(qtype, n, k, seed=n + k)
            wn, rb = np.ascontiguousarray(w.numpy()), w.shape[1]
            x = rng.standard_normal((M, k)).astype(np.float32)
            want = x.astype(np.float64) @ dequantize_reference(w, qtype).double().numpy().T
            bound = k * 1.2e-7 * (np.abs(x) @ np.abs(dequantize_reference(w, qtype).numpy()).T)
            y = np.zeros((M, n), np.float32)
            args_ = (x.ctypes.data, M, wn.ctypes.data, n, k, rb, int(qtype), y.ctypes.data)
            assert new.ab_zmm(*args_) == 0, "no AVX-512 GEMM in this build"
            assert (np.abs(y - want) <= bound + 1e-6).all()
            assert old.ab_blas(address, *args_) == 0
            assert (np.abs(y - want) <= bound + 1e-6).all()
            calls.append((args_, x, wn, y))
        a, b = [], []
        for r in range(args.repeats):
            for side in (0, 1) if r % 2 == 0 else (1, 0):
                t0 = clock()
                for args_, *_ in calls:
                    new.ab_zmm(*args_) if side == 0 else old.ab_blas(address, *args_)
                (a if side == 0 else b).append(clock() - t0)
        _show("4 projections, AVX-512 GEMM vs sgemm", b, a, 2 * M * sum(n * k for n, k in SHAPES))
        # SwiGLU: the fused pass against the product (AVX-512 GEMM) plus torch's silu and mul.
        (gu_args, x, wn, _) = calls[2]
        inter = SHAPES[2][0] // 2
        act = np.zeros((M, inter), np.float32)
        gated_args = (x.ctypes.data, M, wn.ctypes.data, inter, *gu_args[4:7], act.ctypes.data)
        assert new.ab_gated(*gated_args) == 0
        gu = torch.from_numpy(calls[2][3])
        fused, apart = [], []
        for r in range(args.repeats):
            for side in (0, 1) if r % 2 == 0 else (1, 0):
                t0 = clock()
                if side == 0:
                    new.ab_gated(*gated_args)
                else:
                    new.ab_zmm(*gu_args)
                    gate, up = gu.chunk(2, dim=-1)
                    F.silu(gate, inplace=True).mul_(up)
                (fused if side == 0 else apart).append(clock() - t0)
        _show("gate/up + silu * up, fused vs apart", apart, fused, 2 * M * 3072 * 576)


if __name__ == "__main__":
    main()
