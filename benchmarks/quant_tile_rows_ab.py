"""Same-run A/B of the block-format products of 5-16 rows (a decode step of 5-16 concurrent
sequences), the three paths the C kernels have for them:

* ``panels``: ``gguf_panel.h`` (12 weight rows dequantised into an fp32 tile, a 2 x 6
  register-blocked micro-kernel), the only path before ``gguf_tile_rows.h``;
* ``lanes``: ``tile_rows`` (x rows as vector lanes, each block decoded once per call into an
  L1 buffer, 12 register accumulators);
* ``groups``: ``tile_groups`` (the 1-4 row register path over groups of at most 4 x rows).

All three are compiled here from the package's headers into one throw-away library (the
kernels' flags, OpenMP), run on SmolLM2-135M's projections (QKV 960x576, o 576x576, gate/up
3072x576, down 576x1536) in ``--qtype`` (random valid rows), one OpenMP thread timed in the
calling thread's CPU time (``--threads N``: N threads, wall time), the paths alternated
``--repeats`` times. Prints per row count each
path's speed against the panels (min-median-max of the per-repeat ratios) and the panels'
best GFLOP/s; every path is checked against a float64 product first. ``tile_path()`` in
``gguf_tile_rows.h`` takes its thresholds from this.

    .venv/bin/python benchmarks/quant_tile_rows_ab.py --rows 5,8,12,13,16 --repeats 7
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
from deepinfer_kernels.quant import QuantType
from deepinfer_kernels.reference.quant import dequantize_reference
from deepinfer_kernels.testing.quant import random_quant_rows

CSRC = Path(__file__).resolve().parents[1] / "deepinfer_kernels/src/deepinfer_kernels/quant/csrc"
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
PATHS = ("panels", "lanes", "groups")
HARNESS = """
#include <omp.h>
#include "gguf_blocks.h"
#include "gguf_panel.h"
#include "gguf_tile_rows.h"
void ab_threads(int n) { omp_set_num_threads(n); }
void ab_panels(const float *x, const uint8_t *w, const int64_t *seg, float *y, int64_t T,
               int64_t N, int64_t K) {
    panel_linear(x, K, w, seg, 0, y, T, N, K);
}
/* Each path as tile_linear() runs it: every OpenMP thread a contiguous share of the rows. */
void ab_lanes(const float *x, const uint8_t *w, const int64_t *seg, float *y, int64_t T,
              int64_t N, int64_t K) {
#pragma omp parallel
    {
        int64_t lo, hi;
        thread_share(N, &lo, &hi);
        tile_rows(w + lo * seg[3], seg[3], hi - lo, (int)seg[1], K, x, T, K, y, N, lo,
                  (const float *)0);
    }
}
void ab_groups(const float *x, const uint8_t *w, const int64_t *seg, float *y, int64_t T,
               int64_t N, int64_t K) {
#pragma omp parallel
    {
        int64_t lo, hi;
        thread_share(N, &lo, &hi);
        tile_groups(w + lo * seg[3], seg[3], hi - lo, (int)seg[1], K, x, T, K, y, N, lo,
                    (const float *)0);
    }
}
"""


def _build(tmp: Path) -> ctypes.CDLL:
    src, lib = tmp / "tile_rows_ab.c", tmp / "tile_rows_ab.so"
    src.write_text(HARNESS)
    cmd = ["cc", *compile_flags(), "-fopenmp", "-shared", f"-I{CSRC}", str(src), "-o", str(lib)]
    subprocess.run(cmd, check=True)
    dll = ctypes.CDLL(str(lib))
    for name in PATHS:
        f = getattr(dll, f"ab_{name}")
        f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
        f.restype = None
    return dll


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="5,6,8,10,12,13,14,16", help="comma-separated row counts")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--qtype", default="Q4_1", help="Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, BF16, ...")
    p.add_argument(
        "--layers",
        type=int,
        default=1,
        help="copies of the four matrices, each its own allocation, timed as one step (30: a "
        "SmolLM2 decode step's weights, streamed from DRAM as in the model; 1: in cache)",
    )
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads (more than 1: wall time)")
    args = p.parse_args()
    qtype = QuantType[args.qtype.upper()]
    rng = np.random.default_rng(0)
    weights = []
    for i, (n, k) in enumerate(SHAPES * args.layers):
        data = random_quant_rows(qtype, n, k, seed=i % len(SHAPES))
        values = dequantize_reference(data, qtype).double().numpy() if i < len(SHAPES) else None
        weights.append((n, k, np.ascontiguousarray(data.numpy()), values))
    with tempfile.TemporaryDirectory() as tmp:
        dll = _build(Path(tmp))
        dll.ab_threads(args.threads)
        # one thread: the calling thread's CPU time; more: wall time (the others' work counts)
        clock = time.thread_time if args.threads == 1 else time.perf_counter
        fns = {name: getattr(dll, f"ab_{name}") for name in PATHS}
        paths = [n for n in PATHS if n != "groups" or qtype in _REGISTER_TYPES]
        for rows in (int(r) for r in args.rows.split(",")):
            calls = []
            for n, k, data, values in weights:
                seg = np.array([1, int(qtype), n, data.shape[1]], dtype=np.int64)
                x = rng.standard_normal((rows, k)).astype(np.float32)
                if values is not None:  # the first layer's four matrices
                    want = x.astype(np.float64) @ values.T
                    bound = k * 1.2e-7 * (np.abs(x) @ np.abs(values).T) + 1e-6
                    for name in paths:
                        y = np.zeros((rows, n), np.float32)
                        ptrs = (x.ctypes.data, data.ctypes.data, seg.ctypes.data, y.ctypes.data)
                        fns[name](*ptrs, rows, n, k)
                        assert (np.abs(y - want) <= bound).all(), (name, rows, n, k)
                # in cache: repeat each product to ~30 MFLOP; streamed: once per step
                inner = max(1, int(3e7 / (2 * rows * n * k))) if args.layers == 1 else 1
                calls.append((x, data, seg, np.zeros((rows, n), np.float32), n, k, inner))
            spent: dict[str, list[float]] = {name: [] for name in paths}
            for repeat in range(args.repeats):
                order = paths[repeat % len(paths) :] + paths[: repeat % len(paths)]
                for name in order:
                    total = 0.0
                    for x, data, seg, y, n, k, inner in calls:
                        ptrs = (x.ctypes.data, data.ctypes.data, seg.ctypes.data, y.ctypes.data)
                        t0 = clock()
                        for _ in range(inner):
                            fns[name](*ptrs, rows, n, k)
                        total += (clock() - t0) / inner
                    spent[name].append(total)
            flops = 2 * rows * sum(n * k for n, k in SHAPES) * args.layers
            parts = [f"T={rows:2d}: panels {flops / min(spent['panels']) / 1e9:5.1f} GFLOP/s"]
            for name in paths[1:]:
                r = [a / b for a, b in zip(spent["panels"], spent[name], strict=True)]
                parts.append(
                    f"{name} {min(r):.2f}-{statistics.median(r):.2f}-{max(r):.2f}x the panels"
                )
            print(", ".join(parts), flush=True)


_REGISTER_TYPES = {QuantType.Q4_0, QuantType.Q4_1, QuantType.Q8_0, QuantType.F32, QuantType.BF16}
_REGISTER_TYPES.add(QuantType.F16)  # with F16C (every AVX2 CPU this targets has it)


if __name__ == "__main__":
    main()
