"""The MoE/MLA GPU check section imports (and skips cleanly) without a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SECTION = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_sections" / "moe_mla.py"


def test_section_byte_count_and_cpu_skip() -> None:
    spec = importlib.util.spec_from_file_location("_bench_moe_mla", SECTION)
    assert spec is not None and spec.loader is not None
    section = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(section)
    # one sequence of 4 positions reads 4 latent rows of 576 bf16 values
    assert section.latent_bytes(1, 4) == 4 * 576 * 2
    assert callable(section.run)
    if not torch.cuda.is_available():
        assert "skipped" in section.run()
