"""The two exact bf16 products of a decode step, same process, alternated (#24 item 3):

* ``rows``: the checkpoint's own row-major bf16 bytes (the ``quant_linear`` C kernel on a
  ``BF16`` weight, ``gguf_blocks.h``: the path a bf16 checkpoint run from its own tensors
  takes), called through its ctypes entry as the panels are (the op's torch dispatch would
  add its own Python time to one side only);
* ``panels``: the same weights packed into 32-column bf16 panels (``Bf16WeightLinear``, the
  path of the checkpoint widened to fp32, which keeps the panels beside the fp32 copy).

One "step" is SmolLM2-135M's 30 layers of four products (QKV 960x576, O 576x576, gate/up
3072x576, down 576x1536) at one x row (batch-1 decode), each matrix its own allocation, so
every product streams from DRAM as in the model (270 MB of bf16 a step would not fit any
cache). The order of the two rotates every repeat; the figure is the median and quartiles of
the per-repeat ratio (rows time / panels time, inverted: speed of rows against panels).

    .venv/bin/python benchmarks/bf16_rows_vs_panels.py [--repeats 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from deepinfer_kernels.cpu import Bf16WeightLinear, bf16_panels
from deepinfer_kernels.quant import QuantType, QuantWeight
from deepinfer_kernels.quant.ops import default_cpu_kernel

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (out, in) of one layer
LAYERS = 30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # CPU time of the calling thread with one thread (far less sensitive to other processes).
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    panel_kernel, row_kernel = Bf16WeightLinear(), default_cpu_kernel()
    if not (row_kernel.available() and panel_kernel.available()):
        print("needs the compiled CPU kernels (a C compiler)")
        return 1
    g = torch.Generator().manual_seed(0)
    rows, panels = [], []
    for _ in range(LAYERS):
        for out_f, in_f in SHAPES:
            w = (torch.randn(out_f, in_f, generator=g) * 0.05).to(torch.bfloat16)
            rows.append(QuantWeight(w.contiguous().view(torch.uint8), QuantType.BF16, in_f))
            packed = bf16_panels(w.float())
            assert packed is not None  # bf16 values are bf16-exact
            panels.append((packed, out_f))
    xs = {in_f: torch.randn(1, in_f, generator=g) for _, in_f in SHAPES}

    def step_rows() -> None:
        for w in rows:
            row_kernel.linear(xs[w.cols], w.data, w.qtype, w.cols, None)

    def step_panels() -> None:
        for (packed, out_f), (_, in_f) in zip(panels, SHAPES * LAYERS, strict=True):
            panel_kernel(xs[in_f], packed, out_f)

    paths = {"rows": step_rows, "panels": step_panels}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for fn in paths.values():
        fn()  # warm: libraries loaded
    names = list(paths)
    for r in range(args.repeats):
        for name in names[r % 2 :] + names[: r % 2]:
            start = clock()
            paths[name]()
            times[name].append(clock() - start)
    for name, values in times.items():
        print(f"{name:7s} ms per step: median {statistics.median(values) * 1e3:.2f} "
              f"(min {min(values) * 1e3:.2f})")  # fmt: skip
    ratios = sorted(p / r for r, p in zip(times["rows"], times["panels"], strict=True))
    q = len(ratios) // 4
    print(f"rows speed / panels speed: median {statistics.median(ratios):.3f} "
          f"(quartiles {ratios[q]:.3f}-{ratios[-1 - q]:.3f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
