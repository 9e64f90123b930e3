"""The import-linter contracts really encode DESIGN.md: an illegal import makes them fail.

Each case copies one component's source into a temporary directory that shadows the installed
package, adds one forbidden import, and runs `lint-imports` with the project's own contracts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

CASES = [
    ("deepinfer_sched", "import torch\n"),
    ("deepinfer_sched", "import triton\n"),
    ("deepinfer_sched", "import deepinfer_cache\n"),
    ("deepinfer_kernels", "import deepinfer\n"),
    ("deepinfer_kernels", "import deepinfer_spec\n"),
    ("deepinfer_cache", "import deepinfer_kernels\n"),
    ("deepinfer_spec", "import deepinfer_sched\n"),
    ("deepinfer_spec", "import deepinfer\n"),
]


def _run_lint(workdir: Path) -> subprocess.CompletedProcess[str]:
    shutil.copy(ROOT / "pyproject.toml", workdir / "pyproject.toml")
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "pyproject.toml"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )


def _shadow(package: str, workdir: Path, extra_import: str | None) -> None:
    src = ROOT / package / "src" / package
    dst = workdir / package
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    if extra_import is not None:
        (dst / "_contract_probe.py").write_text(extra_import)


@pytest.mark.slow
def test_contracts_pass_on_clean_copy(tmp_path: Path) -> None:
    _shadow("deepinfer_sched", tmp_path, None)
    result = _run_lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("package", "line"), CASES)
def test_forbidden_import_breaks_contract(package: str, line: str, tmp_path: Path) -> None:
    _shadow(package, tmp_path, line)
    result = _run_lint(tmp_path)
    assert result.returncode != 0, f"adding {line.strip()!r} to {package} went unnoticed"
    assert "BROKEN" in result.stdout
    assert f"{package}._contract_probe" in result.stdout
