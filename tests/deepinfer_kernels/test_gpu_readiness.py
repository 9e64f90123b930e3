"""sm_90 resource check on CPU (#23 item 1): Triton compiles the launch table's configurations
for H100/H200 as the JIT would specialise a launch, and the cubins' registers and spills are
read back. Compiling runs in a subprocess because the suite's Triton interpreter cannot compile.

The CI subset (``--quick``: the configurations that spilled before, one per other kernel
family) must not spill; a configuration known to spill (an fp32 MoE tile on 4 warps, 16 bytes
per thread) must be reported as spilling, so the check can fail. ``python -m deepinfer_kernels.gpu_readiness``
compiles the whole table (about 25 configurations, a few minutes on two cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from deepinfer_kernels.gpu_readiness import signature_and_attrs
from deepinfer_kernels.launch_configs import (
    SPLIT_COUNTS,
    decode_split_launch,
    readiness_cases,
    unified_launch,
)

NEGATIVE = """
import json
from dataclasses import replace
from deepinfer_kernels.gpu_readiness import compile_case, cuda_target_available, selected_cases
if not cuda_target_available():
    raise SystemExit(3)
(case,) = selected_cases(match="MoE gate_up_kernel prefill fp32")
spilling = replace(case, num_warps=4, label="MoE gate_up fp32 M=64 on 4 warps")
u = compile_case(spilling)
print(json.dumps([u.registers, u.stack_bytes, u.spills]))
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=_env(), capture_output=True, text=True, timeout=900
    )


def test_quick_table_compiles_for_sm90_without_spills() -> None:
    proc = _run(["-m", "deepinfer_kernels.gpu_readiness", "--quick", "--json"])
    if proc.returncode == 2 and "cannot target CUDA" in proc.stdout:
        pytest.skip("this Triton cannot target CUDA without a GPU here")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    quick = [c.label for c in readiness_cases() if c.quick]
    assert [r["config"] for r in rows] == quick, proc.stderr[-2000:]
    spilled = [f"{r['config']}: {r['stack_bytes']} B" for r in rows if r["spills"]]
    assert not spilled, f"configurations spill registers on sm_90: {spilled}"
    assert proc.returncode == 0
    for r in rows:
        assert 0 < r["registers"] <= 255, r


def test_a_spilling_configuration_is_reported() -> None:
    proc = _run(["-c", NEGATIVE])
    if proc.returncode == 3:
        pytest.skip("this Triton cannot target CUDA without a GPU here")
    assert proc.returncode == 0, proc.stderr[-2000:]
    regs, stack, spills = json.loads(proc.stdout.strip().splitlines()[-1])
    assert spills and stack > 0 and regs == 255


def test_table_is_what_the_wrappers_launch() -> None:
    """The table's entries come from the same functions the wrappers call, and the JIT's
    specialisation is mirrored: aligned pointers and strides, the block-table stride not."""
    cases = {c.label: c for c in readiness_cases()}
    assert len(cases) == len(readiness_cases())  # labels are unique
    decode = unified_launch(total_q=8, batch=8, group=4, head_dim=128, fp32=False, interpret=False)
    assert decode["BLOCK_Q"] * decode["G_PAD"] == 16  # BLOCK_M 16 for decode, as vLLM
    label = next(k for k in cases if k.startswith("unified decode bf16 D=128"))
    assert cases[label].constexprs["BLOCK_N"] == decode["BLOCK_N"]
    assert cases[label].num_warps == decode.num_warps
    split = decode_split_launch(4, 128, fp32=False, interpret=False)
    label = next(k for k in cases if k.startswith("split-K decode bf16 D=128"))
    assert cases[label].constexprs["BLOCK_N"] == split["BLOCK_N"]
    assert cases[label].constexprs["NUM_SPLITS"] in SPLIT_COUNTS

    import importlib

    case = cases[label]
    fn = getattr(importlib.import_module(case.module), case.kernel)
    sig, _, attrs = signature_and_attrs(fn, case)
    names = list(sig)
    aligned = {names[i] for (i,) in attrs}
    assert {"q_ptr", "k_ptr", "stride_kb", "stride_ks", "stride_kh"} <= aligned
    assert "stride_bt" not in aligned and "num_blocks" not in aligned
    assert sig["block_table_ptr"] == "*i32" and sig["po_ptr"] == "*fp32"
    assert sig["q_ptr"] == "*bf16" and sig["scale"] == "fp32"
    unaligned = replace(case, unaligned=(*case.unaligned, "stride_kh"))
    _, _, fewer = signature_and_attrs(fn, unaligned)
    assert len(fewer) == len(attrs) - 1
