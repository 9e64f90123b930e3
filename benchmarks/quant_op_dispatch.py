"""Per-call cost of the ``torch.library`` dispatch of ``dequantize_rows`` and ``quant_swiglu``
against their eager paths (which skip the dispatcher: ``_dispatch.eager_or_op``), same run.

Cases, on SmolLM2-135M's shapes in Q8_0 (hidden 576, intermediate 1536, vocab 49152):
``dequantize_rows`` of 1 and 16 ids (a decode step's embedding lookup) and ``quant_swiglu``
at ``--rows`` rows (a prefill's fused gate/up; the decode step's rows never reach the op
eagerly, ``quant_swiglu`` answers None first). Each round times ``--calls`` calls of the eager
public function, then as many of ``torch.ops.deepinfer.*`` (order alternated per round), one
torch thread, in the thread's CPU time; prints per-call microseconds (median and range over
``--repeats`` rounds) and the op's extra cost per call.

``--eager-only`` times the eager public functions alone, plus ``quant_swiglu``'s None answer at
a decode step's 4 rows (``LlamaMLP`` asks once per layer per step), so a tree without the ops
can be measured too (a ``git archive`` of the old ``deepinfer_kernels/src`` first on
``PYTHONPATH``), alternating processes:

    .venv/bin/python benchmarks/quant_op_dispatch.py --repeats 9
    PYTHONPATH=/tmp/old/deepinfer_kernels/src .venv/bin/python benchmarks/quant_op_dispatch.py --eager-only
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from deepinfer_kernels.quant import QuantType, QuantWeight, dequantize_rows, quant_swiglu
from deepinfer_kernels.testing.quant import random_quant_rows

HIDDEN, INTER, VOCAB = 576, 1536, 49152


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=2000, help="calls per lookup round")
    ap.add_argument("--rows", type=int, default=64, help="prefill rows for quant_swiglu")
    ap.add_argument("--eager-only", action="store_true", help="no op side (an older tree)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    q = QuantType.Q8_0
    table = QuantWeight(random_quant_rows(q, VOCAB, HIDDEN, seed=0), q, HIDDEN)
    gate_up = QuantWeight(random_quant_rows(q, 2 * INTER, HIDDEN, seed=1), q, HIDDEN)
    x = torch.randn(args.rows, HIDDEN)
    ids1, ids16 = torch.tensor([[1234]]), torch.randint(0, VOCAB, (16, 1))
    swiglu_calls = max(1, args.calls // 100)
    if args.eager_only:
        decode_x = torch.randn(4, HIDDEN)
        eager_cases = {
            "dequantize_rows 1 id": (lambda: dequantize_rows(table, ids1), args.calls),
            "dequantize_rows 16 ids": (lambda: dequantize_rows(table, ids16), args.calls),
            "quant_swiglu 4 rows (None)": (lambda: quant_swiglu(decode_x, gate_up), args.calls),
            f"quant_swiglu {args.rows} rows": (lambda: quant_swiglu(x, gate_up), swiglu_calls),
        }
        with torch.inference_mode():
            for name, (fn, calls) in eager_cases.items():
                fn()
                t = [per_call_us(fn, calls) for _ in range(args.repeats)]
                print(
                    f"{name:26s} eager {statistics.median(t):9.2f} us ({min(t):.2f}-{max(t):.2f})"
                )
        return
    rows_op, swiglu_op = torch.ops.deepinfer.dequantize_rows, torch.ops.deepinfer.quant_swiglu
    if quant_swiglu(x, gate_up) is None:
        print("note: no fused SwiGLU here (no AVX-512 or MKL chosen): both sides run the product")
    cases: dict[str, tuple[Callable[[], object], Callable[[], object], int]] = {
        "dequantize_rows 1 id": (
            lambda: dequantize_rows(table, ids1),
            lambda: rows_op(table.data, ids1, int(q), HIDDEN),
            args.calls,
        ),
        "dequantize_rows 16 ids": (
            lambda: dequantize_rows(table, ids16),
            lambda: rows_op(table.data, ids16, int(q), HIDDEN),
            args.calls,
        ),
        f"quant_swiglu {args.rows} rows": (
            lambda: quant_swiglu(x, gate_up),
            lambda: swiglu_op(x, gate_up.data, int(q), HIDDEN, False),
            swiglu_calls,
        ),
    }
    with torch.inference_mode():
        for eager, op, _calls in cases.values():  # warm: builds the kernel, imports the stack
            eager(), op()
        for name, (eager, op, calls) in cases.items():
            a: list[float] = []
            b: list[float] = []
            for r in range(args.repeats):
                if r % 2:
                    b.append(per_call_us(op, calls))
                    a.append(per_call_us(eager, calls))
                else:
                    a.append(per_call_us(eager, calls))
                    b.append(per_call_us(op, calls))
            diff = [bb - aa for aa, bb in zip(a, b)]
            print(
                f"{name:26s} eager {statistics.median(a):9.1f} us ({min(a):.1f}-{max(a):.1f})"
                f"  op {statistics.median(b):9.1f} us ({min(b):.1f}-{max(b):.1f})"
                f"  op extra {statistics.median(diff):+.1f} us ({min(diff):+.1f}..{max(diff):+.1f})"
            )


if __name__ == "__main__":
    main()
