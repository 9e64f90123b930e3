"""Each distribution builds a wheel whose name, version and dependencies match DESIGN.md.

The dependency table is checked on the built metadata, so a package can never silently start
depending on a sibling (or on torch, for the scheduler) that DESIGN.md forbids.
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

# setuptools builds in the project directory itself (its build/ and *.egg-info/): a wheel and
# an sdist of one project built at the same time on two xdist workers rewrite the same files.
# One group runs these builds one after another on one worker (`make test` uses loadgroup).
pytestmark = pytest.mark.xdist_group("setuptools_in_tree")

SIBLINGS = {
    "deepinfer-kernels",
    "deepinfer-cache",
    "deepinfer-sched",
    "deepinfer-spec",
    "deepinfer",
}

# DESIGN.md's table: the runtime (non-extra) requirements each distribution may declare.
ALLOWED_RUNTIME = {
    "deepinfer-kernels": {"torch", "triton", "numpy"},
    "deepinfer-cache": {"torch", "numpy", "xxhash"},  # xxhash: block payload checksums
    "deepinfer-sched": {"numpy"},
    "deepinfer-spec": {"torch", "numpy", "safetensors", "tqdm", "deepinfer-kernels"},
    "deepinfer": {
        "deepinfer-kernels",
        "deepinfer-cache",
        "deepinfer-sched",
        "deepinfer-spec",
        "torch",
        "numpy",
        "safetensors",
        "gguf",
        "tokenizers",
        "jinja2",
        "tqdm",
        "matplotlib",
        "llguidance",  # structured output (JSON schema, regex, grammar token masks)
    },
}

PROJECT_DIRS = {
    "deepinfer-kernels": ROOT / "deepinfer_kernels",
    "deepinfer-cache": ROOT / "deepinfer_cache",
    "deepinfer-sched": ROOT / "deepinfer_sched",
    "deepinfer-spec": ROOT / "deepinfer_spec",
    "deepinfer": ROOT,
}


def _declared_version(project_dir: Path) -> str:
    with open(project_dir / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _build_wheel(project_dir: Path, out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(project_dir),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def _build_sdist(project_dir: Path, out: Path) -> Path:
    """The sdist, built by setuptools' own PEP 517 backend (no isolation, no network)."""
    code = (
        "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=project_dir,
        check=True,
        capture_output=True,
        env=env,
    )
    (sdist,) = out.glob("*.tar.gz")
    return sdist


def _twine_check(*files: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode())


@pytest.mark.slow
@pytest.mark.parametrize("dist", sorted(PROJECT_DIRS))
def test_wheel_metadata_follows_design(dist: str, tmp_path: Path) -> None:
    project_dir = PROJECT_DIRS[dist]
    wheel = _build_wheel(project_dir, tmp_path)
    meta = _metadata(wheel)

    assert meta["Name"] == dist
    assert meta["Version"] == _declared_version(project_dir)

    requirements = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    runtime = [r for r in requirements if "extra" not in str(r.marker or "")]
    runtime_names = {r.name.lower() for r in runtime}
    assert runtime_names <= ALLOWED_RUNTIME[dist], runtime_names - ALLOWED_RUNTIME[dist]

    for req in requirements:
        if req.name.lower() == dist:
            # Only an extra may name its own distribution (``ray = ["deepinfer[serve]", ...]``).
            assert req.extras and "extra" in str(req.marker or ""), req
            assert not req.specifier, req
            continue
        if req.name.lower() in SIBLINGS:
            # Siblings are depended on by range: an exact pin would freeze independent releases.
            assert not any(spec.operator in ("==", "===") for spec in req.specifier), req
            assert req.specifier, f"{req} needs a version range"

    # Publishable: license, authors, URLs, classifiers, a README rendered by PyPI.
    assert meta["License-Expression"] == "Apache-2.0"
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["Author"] or meta["Author-email"]
    urls = meta.get_all("Project-URL") or []
    assert {u.split(",")[0] for u in urls} >= {"Homepage", "Documentation", "Changelog"}
    assert "Typing :: Typed" in (meta.get_all("Classifier") or [])
    assert meta["Description-Content-Type"] == "text/markdown"
    assert "## Quick start" in meta.get_payload(), "the package README needs its own quick start"
    _twine_check(wheel)

    packaged = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    import_name = dist.replace("-", "_")
    assert import_name in packaged
    assert f"{import_name}/py.typed" in zipfile.ZipFile(wheel).namelist()
    if dist == "deepinfer":
        names = zipfile.ZipFile(wheel).namelist()
        # The shipped DSpark drafter must travel with the package, not stay in the checkout.
        assert "deepinfer/data/dspark-smollm2/drafter.safetensors" in names
    if dist == "deepinfer-kernels":
        names = zipfile.ZipFile(wheel).namelist()
        # Every CPU kernel's C source (compiled on first use) travels with the kernels.
        for stem in (
            "paged_attention_tiles",
            "bf16_weight_linear",
            "add_rms_norm",
            "decoder_layer",
        ):
            assert f"deepinfer_kernels/cpu/csrc/{stem}.c" in names


def test_allowed_table_keeps_scheduler_free_of_torch() -> None:
    # Guards the table itself against an edit that would let the scheduler pull in torch.
    assert not ALLOWED_RUNTIME["deepinfer-sched"] & {"torch", "triton"}
    for dist in ("deepinfer-kernels", "deepinfer-cache", "deepinfer-sched"):
        assert not ALLOWED_RUNTIME[dist] & SIBLINGS
    assert ALLOWED_RUNTIME["deepinfer-spec"] & SIBLINGS == {"deepinfer-kernels"}


@pytest.mark.slow
@pytest.mark.parametrize("dist", sorted(PROJECT_DIRS))
def test_sdist_carries_license_and_changelog_and_twine_accepts_it(
    dist: str, tmp_path: Path
) -> None:
    sdist = _build_sdist(PROJECT_DIRS[dist], tmp_path)
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= members
    _twine_check(sdist)
