"""Shared pytest set-up: hypothesis profiles, the Triton interpreter on CPU, the gpu marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# The Triton interpreter must be chosen before any kernel is decorated, so before test
# modules import deepinfer_kernels. On a CUDA machine the real compiler runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The repository's own kernel tests draw deepinfer_kernels.testing's quick sizes (the suite
# runs on the Triton interpreter); users of the kit get the thorough ones by default.
os.environ.setdefault("DEEPINFER_TESTING_PROFILE", "quick")

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev", max_examples=10, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def no_c_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No C compiler in ``$CC`` or on ``PATH`` (an empty directory under ``tmp_path``): the
    compiled CPU kernels must warn once and leave their callers on torch."""
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
