"""One-shot GPU check (one H200, under 5 minutes).

1. Runs the kernel tests on CUDA: ``pytest tests/deepinfer_kernels -m "not slow"``.
2. Imports every module in ``benchmarks/gpu_sections/`` (sorted by name) and calls its
   ``run() -> str``, which returns a markdown section (a heading and tables).

Everything is printed; with ``OUT`` set the report is also written to ``$OUT/gpu_check.md``.
Run::

    .venv/bin/python benchmarks/gpu_check.py
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = Path(__file__).resolve().parent / "gpu_sections"
TEST_TIMEOUT_S = 210


def section_modules() -> list[ModuleType]:
    """Import (without running) every section module."""
    modules = []
    for path in sorted(SECTIONS.glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"gpu_sections.{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not callable(getattr(module, "run", None)):
            raise ImportError(f"{path} has no run() -> str")
        modules.append(module)
    return modules


def run_tests() -> str:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/deepinfer_kernels",
        "-m",
        "not slow",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=TEST_TIMEOUT_S, check=False
        )
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        status = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        tail = "\n".join(out.strip().splitlines()[-15:])
        status = f"TIMED OUT after {TEST_TIMEOUT_S} s"
    elapsed = time.perf_counter() - start
    return (
        f"## Kernel tests on CUDA\n\n`{' '.join(cmd[2:])}`: **{status}** in {elapsed:.0f} s\n\n"
        f"```\n{tail}\n```\n"
    )


def main() -> int:
    parts = ["# DeepInfer GPU check\n"]
    try:
        import torch

        if torch.cuda.is_available():
            parts.append(f"Device: {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
        else:
            parts.append("No CUDA device: sections will report that they were skipped.\n")
    except ImportError:
        parts.append("torch is not installed\n")
    parts.append(run_tests())
    print(parts[-1], flush=True)
    for module in section_modules():
        try:
            text = module.run()
        except Exception:  # a broken section must not hide the others
            text = f"## {module.__name__}\n\nFAILED:\n```\n{traceback.format_exc()}\n```\n"
        parts.append(text)
        print(text, flush=True)
    report = "\n".join(parts)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "gpu_check.md").write_text(report)
    return 0 if "FAILED" not in report and "TIMED OUT" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
