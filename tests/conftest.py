"""Shared pytest set-up: hypothesis profiles, the Triton interpreter on CPU, the gpu marker."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
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
# too_slow is a wall-clock check on generating examples: on a loaded 2-core runner the tensor
# strategies can trip it with nothing wrong, and `make test` runs this profile wherever $CI is
# unset, so neither profile lets the machine's speed fail a test.
settings.register_profile(
    "dev", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _seed_torch(name: str) -> None:
    # numpy's and random's global generators need no seeding: the suite never draws from
    # them (ruff's NPY002 and random.Random instances), and hypothesis seeds them per example.
    torch.manual_seed(zlib.crc32(name.encode()))


@pytest.fixture(scope="module", autouse=True)
def _seeded_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """Module fixtures that draw from torch's global generator (random models, drafters)
    start from the module's own seed, whichever test asks for them first (each test leaves
    the module's seed behind: see `_seeded_test`)."""
    _seed_torch(request.node.nodeid)
    yield


@pytest.fixture(autouse=True)
def _seeded_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts from its own seed of torch's global generator (from its node id): a
    test that draws without a generator gets the same data whatever ran before it in its
    process, so the order in which an xdist worker happens to run tests (it varies from run
    to run) cannot change its outcome."""
    _seed_torch(request.node.nodeid)
    yield
    # A module fixture first asked for by the next test draws from the module's seed, not
    # from whatever this test left.
    _seed_torch(request.node.nodeid.split("::", 1)[0])


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
