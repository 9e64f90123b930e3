"""Same-run A/B of the block-format product for more than two rows: the panel path
(``quant/csrc/gguf_panel.h``: 12-row panels dequantised into an fp32 tile, a 2 x 6
register-blocked micro-kernel) against the row-at-a-time path it replaced (``project_row``:
dequantise one weight row into a buffer, dot it with four x rows at a time).

Both are compiled here from the package's headers into one throw-away library (same flags as
the kernels: ``-O3 -march=native``, OpenMP), on SmolLM2-135M's Q4_1 projections (QKV 960x576,
o 576x576, gate/up 3072x576, down 576x1536), one OpenMP thread, the calling thread's CPU time,
the two alternated ``--repeats`` times. Prints per row count the speed ratio old / new
(min-median-max over the repeats) and the panel path's best GFLOP/s; checks both against a
float64 product first.

    .venv/bin/python benchmarks/gguf_panel_ab.py --rows 3,8,16,64,512 --repeats 7
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

from deepinfer_kernels.cpu.build import compile_flags

CSRC = Path(__file__).resolve().parents[1] / "deepinfer_kernels/src/deepinfer_kernels/quant/csrc"
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HARNESS = """
#include <omp.h>
#include "gguf_panel.h"
void ab_one_thread(void) { omp_set_num_threads(1); }
void ab_old(const float *x, const uint8_t *w, const int64_t *seg, float *y, int64_t T,
            int64_t N, int64_t K) {  /* block_linear before gguf_panel.h (one segment) */
#pragma omp parallel
    {
        float buf[K + 16] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++)
            project_row(w + n * seg[3], (int)seg[1], K, x, T, K, buf, y, N, n, 0.0f);
    }
}
void ab_new(const float *x, const uint8_t *w, const int64_t *seg, float *y, int64_t T,
            int64_t N, int64_t K) {
    panel_linear(x, K, w, seg, 0, y, T, N, K);
}
"""


def _build(tmp: Path) -> ctypes.CDLL:
    src, lib = tmp / "panel_ab.c", tmp / "panel_ab.so"
    src.write_text(HARNESS)
    cmd = ["cc", *compile_flags(), "-fopenmp", "-shared", f"-I{CSRC}", str(src), "-o", str(lib)]
    subprocess.run(cmd, check=True)
    dll = ctypes.CDLL(str(lib))
    for f in (dll.ab_old, dll.ab_new):
        f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
        f.restype = None
    return dll


def _q4_1(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random Q4_1 rows (small fp16 scales and minimums) and their float64 values."""
    blocks = rng.integers(0, 256, size=(n, k // 32, 20), dtype=np.uint8)
    d = (rng.random((n, k // 32)) * 0.01).astype(np.float16)
    m = (-rng.random((n, k // 32)) * 0.05).astype(np.float16)
    blocks[:, :, 0:2] = d.view(np.uint8).reshape(n, k // 32, 2)
    blocks[:, :, 2:4] = m.view(np.uint8).reshape(n, k // 32, 2)
    q = np.concatenate([blocks[:, :, 4:] & 15, blocks[:, :, 4:] >> 4], axis=2)
    values = d.astype(np.float64)[..., None] * q + m.astype(np.float64)[..., None]
    return np.ascontiguousarray(blocks.reshape(n, -1)), values.reshape(n, k)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="3,8,16,64,512", help="comma-separated row counts T")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    weights = [(n, k, *_q4_1(rng, n, k)) for n, k in SHAPES]
    with tempfile.TemporaryDirectory() as tmp:
        dll = _build(Path(tmp))
        dll.ab_one_thread()  # the CPU time below is the calling thread's
        for rows in (int(r) for r in args.rows.split(",")):
            calls = []
            for n, k, data, values in weights:
                seg = np.array([1, 3, n, data.shape[1]], dtype=np.int64)
                x = rng.standard_normal((rows, k)).astype(np.float32)
                want = x.astype(np.float64) @ values.T
                for f in (dll.ab_old, dll.ab_new):
                    y = np.zeros((rows, n), np.float32)
                    f(x.ctypes.data, data.ctypes.data, seg.ctypes.data, y.ctypes.data, rows, n, k)
                    bound = 1e-6 * (np.abs(x) @ np.abs(values).T) + 1e-6
                    assert (np.abs(y - want) <= bound).all(), (f, rows, n, k)
                inner = max(1, int(5e7 / (2 * rows * n * k)))
                calls.append((x, data, seg, np.zeros((rows, n), np.float32), n, k, inner))
            ratios, best = [], float("inf")
            for _ in range(args.repeats):
                spent = {}
                for name, f in (("old", dll.ab_old), ("new", dll.ab_new)):
                    total = 0.0
                    for x, data, seg, y, n, k, inner in calls:
                        ptrs = (x.ctypes.data, data.ctypes.data, seg.ctypes.data, y.ctypes.data)
                        t0 = time.thread_time()
                        for _ in range(inner):
                            f(*ptrs, rows, n, k)
                        total += (time.thread_time() - t0) / inner
                    spent[name] = total
                ratios.append(spent["old"] / spent["new"])
                best = min(best, spent["new"])
            flops = 2 * rows * sum(n * k for n, k in SHAPES)
            print(f"T={rows:5d}: panel / row path speed {min(ratios):.2f}-"
                  f"{statistics.median(ratios):.2f}-{max(ratios):.2f}x (min-median-max), "
                  f"panel {flops / best / 1e9:.1f} GFLOP/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
