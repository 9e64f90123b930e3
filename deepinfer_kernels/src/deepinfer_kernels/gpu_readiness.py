"""Ahead-of-time resource check of Triton kernels for sm_90 (H100/H200), on a machine without
a GPU (#23 item 1, first step).

Triton compiles for a GPU it does not have: ``triton.compile`` with ``GPUTarget("cuda", 90,
32)`` produces the cubin, and the ``cuobjdump`` bundled with Triton's NVIDIA backend reads its
register count and stack (local-memory spill) size. This reports the split-K decode kernel at
the launch settings its wrapper uses (``triton_decode.decode_launch_config``, shared), so a
change that makes a configuration spill shows up in CI, not on the first GPU run.

Run ``python -m deepinfer_kernels.gpu_readiness`` (add ``--json`` for machine-readable
output). The Triton interpreter must be off in that process (``TRITON_INTERPRET`` unset before
import), since interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SM90 = 90
_INT_PTRS = ("block_table_ptr", "seq_lens_ptr", "cu_q_ptr")
_FP32_PTRS = ("po_ptr", "plse_ptr", "lse_ptr")


@dataclass(frozen=True)
class ResourceUsage:
    """Registers per thread and stack bytes per thread (local memory: spills) of one config."""

    kernel: str
    config: str
    registers: int
    stack_bytes: int

    @property
    def spills(self) -> bool:
        return self.stack_bytes > 0


def _cuobjdump() -> Path | None:
    try:
        import triton
    except ImportError:
        return None
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return tool if tool.is_file() else None


def cuda_target_available() -> bool:
    """Whether this Triton can compile for CUDA here and its cubins can be inspected."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or _cuobjdump() is None:
        return False
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        return False
    return True


def _signature(fn: Any, dtype: str, constexprs: dict[str, Any]) -> dict[str, str]:
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = (
                "*i32" if name in _INT_PTRS else "*fp32" if name in _FP32_PTRS else f"*{dtype}"
            )
        elif name in ("scale", "soft_cap"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_usage(
    fn: Any, *, dtype: str, constexprs: dict[str, Any], num_warps: int, num_stages: int,
    config: str, arch: int = SM90,
) -> ResourceUsage:  # fmt: skip
    """Compile ``fn`` (a ``@triton.jit`` kernel) for ``sm_<arch>`` and read its resources."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tool = _cuobjdump()
    if tool is None:
        raise RuntimeError("gpu_readiness: Triton's cuobjdump is not installed")
    src = ASTSource(fn=fn, signature=_signature(fn, dtype, constexprs), constexprs=constexprs)
    kernel = triton.compile(
        src,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        text = subprocess.run(
            [str(tool), "--dump-resource-usage", str(cubin)],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    regs = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    if regs is None or stack is None:
        raise RuntimeError(f"gpu_readiness: unreadable resource usage for {config}: {text!r}")
    return ResourceUsage(fn.fn.__name__, config, int(regs.group(1)), int(stack.group(1)))


def decode_usages(
    head_dims: tuple[int, ...] = (128, 256), dtypes: tuple[str, ...] = ("bf16", "fp32")
) -> list[ResourceUsage]:
    """The split-K decode kernel at its wrapper's launch settings (GQA group 4, 16-token
    blocks, 4 splits), per head dim and dtype."""
    from deepinfer_kernels.attention.triton_decode import (
        _decode_split_kernel,
        decode_launch_config,
    )

    out = []
    for dtype in dtypes:
        for d in head_dims:
            launch = decode_launch_config(4, d)
            constexprs = {
                "NUM_SPLITS": 4, "NUM_Q_HEADS": 32, "HEAD_DIM": d, "D_PAD": d, "BLOCK_SIZE": 16,
                "GROUP": 4, "BLOCK_H": launch["BLOCK_H"], "BLOCK_N": launch["BLOCK_N"],
                "USE_WINDOW": False, "USE_CAP": False,
                "PRECISION": "ieee" if dtype == "fp32" else "tf32", "UPCAST": False,
            }  # fmt: skip
            config = f"{dtype} D={d} BLOCK_H={launch['BLOCK_H']} BLOCK_N={launch['BLOCK_N']}"
            usage = compile_usage(
                _decode_split_kernel,
                dtype=dtype,
                constexprs=constexprs,
                num_warps=launch["num_warps"],
                num_stages=launch["num_stages"],
                config=config,
            )
            out.append(usage)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    args = parser.parse_args(argv)
    if not cuda_target_available():
        print("gpu_readiness: this Triton cannot target CUDA here (or TRITON_INTERPRET=1)")
        return 2
    for usage in decode_usages():
        if args.json:
            print(json.dumps({**asdict(usage), "spills": usage.spills}))
        else:
            flag = "SPILLS" if usage.spills else "ok"
            print(f"{usage.kernel:24s} {usage.config:40s} regs={usage.registers:3d} "
                  f"stack={usage.stack_bytes:5d} B  {flag}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
