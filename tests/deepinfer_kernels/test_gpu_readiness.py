"""sm_90 resource check on CPU (#23 item 1, first step): Triton compiles the split-K decode
kernel for H100/H200 at its wrapper's launch settings and the cubin's registers and spills are
read back. Runs in a subprocess because the suite's Triton interpreter cannot compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json
from deepinfer_kernels.attention.triton_decode import _merge_states_kernel
from deepinfer_kernels.gpu_readiness import compile_usage, cuda_target_available, decode_usages
if not cuda_target_available():
    raise SystemExit(3)
small = compile_usage(
    _merge_states_kernel, dtype="fp32", constexprs={"HEAD_DIM": 128, "D_PAD": 128},
    num_warps=4, num_stages=3, config="merge D=128",
)
rows = [small, *decode_usages()]
print(json.dumps([[u.kernel, u.config, u.registers, u.stack_bytes, u.spills] for u in rows]))
"""


def test_decode_configs_compile_for_sm90_and_report_spills() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode == 3:
        pytest.skip("this Triton cannot target CUDA without a GPU here")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    small, *decode = rows
    # A tiny kernel neither spills nor comes near the register file: the reading works.
    assert small[3] == 0 and not small[4] and 0 < small[2] < 128
    assert len(decode) == 4 and {r[0] for r in decode} == {"_decode_split_kernel"}
    for _, config, regs, stack, spills in decode:
        assert 0 < regs <= 255, config
        assert spills == (stack > 0), config
