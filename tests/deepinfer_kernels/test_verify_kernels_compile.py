"""The verification, sampling and KV Triton kernels compile to sm_90 (H100/H200) cubins.

The interpreter is lenient about types that the compiler rejects, so this builds every kernel
ahead of time for a Hopper target (no GPU needed) in a subprocess without TRITON_INTERPRET.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from deepinfer_kernels.kv.triton_kv import _move_blocks_kernel, _write_rows_kernel
    from deepinfer_kernels.launch_configs import SAMPLING_MAX_ROUNDS
    from deepinfer_kernels.sampling.triton_sampling import _sample_kernel
    from deepinfer_kernels.verify.triton_verify import (
        _greedy_verify_kernel,
        _speculative_verify_kernel,
    )

    target = GPUTarget("cuda", 90, 32)
    p64, f32, p32, bf16 = "*i64", "*fp32", "*i32", "*bf16"

    def build(fn, names, types, consts):
        sig = dict(zip(names, types))
        sig.update({k: "constexpr" for k in consts})
        kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target)
        assert "cubin" in kernel.asm, fn.__name__

    spec = ["ids_ptr", "n_ptr", "pt_ptr", "pd_ptr", "au_ptr", "su_ptr", "out_ptr", "acc_ptr",
            "emit_ptr", "err_ptr", "B", "G", "V", "s_ids_b", "s_ids_g", "s_pt_b", "s_pt_g",
            "s_pt_v", "s_pd_b", "s_pd_g", "s_pd_v"]
    spec_t = [p64, p64, bf16, f32, f32, f32, p64, p64, p64, p32] + ["i32"] * 11
    for has_draft in (True, False):
        build(_speculative_verify_kernel, spec, spec_t,
              {"HAS_DRAFT": has_draft, "BLOCK_B": 1, "BLOCK_V": 4096})
    greedy = ["ids_ptr", "n_ptr", "lg_ptr", "out_ptr", "acc_ptr", "emit_ptr", "B", "G", "V",
              "s_ids_b", "s_ids_g", "s_lg_b", "s_lg_g", "s_lg_v"]
    build(_greedy_verify_kernel, greedy, [p64, p64, bf16, p64, p64, p64] + ["i32"] * 8,
          {"BLOCK_B": 1, "BLOCK_V": 4096})
    samp = ["lg_ptr", "t_ptr", "k_ptr", "p_ptr", "mp_ptr", "u_ptr", "seed_ptr", "out_ptr",
            "rounds_ptr", "B", "V", "s_lg_b", "s_lg_v"]
    build(_sample_kernel, samp, [bf16, f32, p64, f32, f32, f32, p64, p64, p32] + ["i32"] * 4,
          {"BLOCK_B": 1, "BLOCK_V": 4096, "MAX_ROUNDS": SAMPLING_MAX_ROUNDS})
    write = ["src_ptr", "dst_ptr", "slot_ptr", "T", "INNER", "NUM_SLOTS", "BLOCK_SIZE",
             "s_src_t", "s_dst_b", "s_dst_o"]
    build(_write_rows_kernel, write, [f32, bf16, p64] + ["i32"] * 7,
          {"BLOCK_T": 4, "BLOCK_C": 1024})
    move = ["src_ptr", "dst_ptr", "ids_ptr", "N", "NB_SRC", "NB_DST", "INNER"]
    for gather in (True, False):
        build(_move_blocks_kernel, move, [bf16, bf16, p64] + ["i32"] * 4,
              {"GATHER": gather, "BLOCK_C": 4096})
    print("compiled")
    """
)


@pytest.mark.slow
def test_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("no ptxas available for ahead-of-time compilation")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "compiled" in proc.stdout
