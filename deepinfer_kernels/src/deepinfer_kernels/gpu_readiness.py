"""Ahead-of-time resource check of every Triton kernel configuration for sm_90 (H100/H200),
on a machine without a GPU (#23 item 1).

Triton compiles for a GPU it does not have: ``triton.compile`` with ``GPUTarget("cuda", 90,
32)`` produces the cubin, and the ``cuobjdump`` bundled with Triton's NVIDIA backend reads its
register count and stack (local-memory spill) size. The configurations come from
:func:`deepinfer_kernels.launch_configs.readiness_cases`, the table the wrappers launch from,
and are compiled with the specialisation the JIT gives a real launch (16-byte aligned
pointers, strides that are multiples of 16, unit strides as constants), so a change that makes
a configuration spill shows up in CI, not on the first GPU run.

Run ``python -m deepinfer_kernels.gpu_readiness`` (``--quick`` for the CI subset, ``--json``
for machine-readable output); the exit status is 1 when a configuration spills. The Triton
interpreter must be off in that process (``TRITON_INTERPRET`` unset before import), since
interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deepinfer_kernels.launch_configs import ReadinessCase, readiness_cases

SM90 = 90
_FLOAT_ARGS = ("scale", "soft_cap")


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


def _is_stride(name: str) -> bool:
    return name.startswith(("stride", "s_"))


def signature_and_attrs(
    fn: Any, case: ReadinessCase
) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list[list[Any]]]]:
    """``(signature, constexprs, attrs)`` for ``ASTSource``, as the JIT would specialise a
    launch of ``case``: pointers typed by ``case.ptr_types`` (else the case dtype), floats for
    scale arguments, int32 otherwise; ``tt.divisibility`` 16 on pointers, aligned strides and
    ``case.aligned``; arguments in ``case.ones`` become the constant 1."""
    constexprs = dict(case.constexprs)
    constexprs.update(dict.fromkeys(case.ones, 1))
    sig: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for index, name in enumerate(inspect.signature(fn.fn).parameters):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            sig[name] = case.ptr_types.get(name, f"*{case.dtype}")
            aligned = True
        elif name in _FLOAT_ARGS:
            sig[name] = "fp32"
            aligned = False
        else:
            sig[name] = "i32"
            aligned = (_is_stride(name) and name not in case.unaligned) or name in case.aligned
        if aligned:
            attrs[(index,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def compile_case(case: ReadinessCase, arch: int = SM90) -> ResourceUsage:
    """Compile one table entry for ``sm_<arch>`` and read its registers and spills."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tool = _cuobjdump()
    if tool is None:
        raise RuntimeError("gpu_readiness: Triton's cuobjdump is not installed")
    fn = getattr(importlib.import_module(case.module), case.kernel)
    sig, constexprs, attrs = signature_and_attrs(fn, case)
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(
        src,
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": case.num_warps, "num_stages": case.num_stages},
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
        raise RuntimeError(f"gpu_readiness: unreadable resource usage for {case.label}: {text!r}")
    return ResourceUsage(case.kernel, case.label, int(regs.group(1)), int(stack.group(1)))


def selected_cases(quick: bool = False, match: str | None = None) -> list[ReadinessCase]:
    """The table, or its ``quick`` subset; ``match`` keeps labels containing that text."""
    cases = [c for c in readiness_cases() if c.quick or not quick]
    return [c for c in cases if match is None or match in c.label]


def usages(cases: Iterable[ReadinessCase]) -> list[ResourceUsage]:
    return [compile_case(c) for c in cases]


def format_usage(usage: ResourceUsage) -> str:
    flag = "SPILLS" if usage.spills else "ok"
    return (
        f"{usage.kernel:26s} {usage.config:58s} regs={usage.registers:3d} "
        f"stack={usage.stack_bytes:5d} B  {flag}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    parser.add_argument("--quick", action="store_true", help="only the CI subset")
    parser.add_argument("--match", default=None, help="only labels containing this text")
    args = parser.parse_args(argv)
    if not cuda_target_available():
        print("gpu_readiness: this Triton cannot target CUDA here (or TRITON_INTERPRET=1)")
        return 2
    spilled = False
    for case in selected_cases(args.quick, args.match):
        usage = compile_case(case)
        spilled |= usage.spills
        if args.json:
            print(json.dumps({**asdict(usage), "spills": usage.spills}), flush=True)
        else:
            print(format_usage(usage), flush=True)
    return 1 if spilled else 0


if __name__ == "__main__":
    raise SystemExit(main())
