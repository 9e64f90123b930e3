"""The lean runtime's prefill against the engine's, alternated in one process (#24, L2).

Three timings a round on the same 2k-token prompt (the code prompt repeated) and the same
GGUF file (default: the embedded SmolLM2-135M Q4_1): the engine (``LLM.generate``, one new
token), the lean runtime's many-row path (``LeanModel.prefill``: products and causal
attention on numpy's OpenBLAS sgemm), and, with ``--before``, the lean runtime's block-kernel
path (``sgemm=None``: the fused layer calls and 16-query tiles, as before L2's change).
Ratios are lean / engine speed, median (range) over the rounds. ``--cpu-time`` times CPU
seconds (fair on a loaded machine at one thread); else wall time.

    .venv/bin/python benchmarks/lean_prefill_ab.py --threads 1 --cpu-time --before --repeats 4
    .venv/bin/python benchmarks/lean_prefill_ab.py --threads 2 --before --repeats 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the embedded one)")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--cpu-time", action="store_true", help="CPU seconds, not wall time")
    parser.add_argument("--before", action="store_true", help="also time the block-kernel path")
    args = parser.parse_args()
    if args.tokens < 17 or args.threads < 1 or args.repeats < 1:
        parser.error("--tokens >= 17, --threads >= 1 and --repeats >= 1 expected")

    import torch
    from vs_llamacpp import CODE_PROMPT

    from deepinfer import LLM, EngineConfig, SamplingParams
    from deepinfer.lean import LeanLLM
    from deepinfer_kernels.cpu import set_num_threads

    torch.set_num_threads(args.threads)
    ctx = args.tokens + 64
    engine = LLM(args.model, enable_prefix_caching=False,
                 engine_config=EngineConfig(max_model_len=ctx, num_blocks=-(-ctx // 16) + 2))  # fmt: skip
    lean = LeanLLM(args.model, max_model_len=ctx, threads=args.threads)
    set_num_threads(args.threads)  # one OpenMP runtime (torch's) serves both here
    model = lean.model
    assert model is not None
    sgemm = model.sgemm
    if sgemm is None:
        print("note: the BLAS rule keeps MKL here (Intel CPU or no threadpoolctl): lean runs "
              "its block kernels in both columns")  # fmt: skip
    ids = engine.encode(CODE_PROMPT * 200)[: args.tokens]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    clock = time.process_time if args.cpu_time else time.perf_counter

    def lean_rate(path: object) -> float:
        model.sgemm = path  # type: ignore[assignment]
        model.reset()
        t = clock()
        model.prefill(ids)
        return len(ids) / (clock() - t)

    def engine_rate() -> float:
        t = clock()
        engine.generate([ids], params)
        return len(ids) / (clock() - t)

    after: list[float] = []
    before: list[float] = []
    unit = "tok/CPU-s" if args.cpu_time else "tok/s"
    for r in range(args.repeats):
        e = engine_rate()
        a = lean_rate(sgemm)
        b = lean_rate(None) if args.before else float("nan")
        after.append(a / e)
        if args.before:
            before.append(b / e)
        print(f"round {r + 1}: engine {e:.0f}, lean {a:.0f}, lean block kernels {b:.0f} {unit}; "
              f"lean/engine {a / e:.2f}x, block kernels/engine {b / e:.2f}x", flush=True)  # fmt: skip
    print(f"{len(ids)}-token prefill, {args.threads} thread(s), {unit}: lean / engine "
          f"{_median_range(after)}" + (f"; before (block kernels) {_median_range(before)}"
                                      if before else ""))  # fmt: skip
    engine.close()
    lean.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
