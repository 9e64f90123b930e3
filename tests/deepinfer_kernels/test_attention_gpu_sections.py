"""The GPU check script and its sections import (and skip cleanly) without a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(path: Path):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_imports_every_section() -> None:
    gpu_check = _load(BENCH / "gpu_check.py")
    modules = gpu_check.section_modules()
    names = {m.__name__.split(".")[-1] for m in modules}
    assert "attention" in names
    assert all(callable(m.run) for m in modules)


def test_attention_section_flop_count_and_cpu_skip() -> None:
    section = _load(BENCH / "gpu_sections" / "attention.py")
    # one query over 3 prefix keys + itself: 4 pairs, each 4 * D flops per head
    assert section._causal_flops(1, 3, 1) == 4.0 * section.HQ * section.D * 4
    if not torch.cuda.is_available():
        assert "skipped" in section.run()


def test_sampling_section_cpu_skip() -> None:
    section = _load(BENCH / "gpu_sections" / "sampling.py")
    assert section.VOCAB == 128256 and "top-k 50 + top-p 0.9" in section.SETTINGS
    if not torch.cuda.is_available():
        assert "skipped" in section.run()
