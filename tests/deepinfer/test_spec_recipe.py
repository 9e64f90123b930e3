"""The drafter recipe (``recipes/dspark_smollm2``) end to end on a tiny budget: resume from the
shipped checkpoint, train two steps, evaluate, export, and draft losslessly in the engine with
the exported checkpoint. A full run is the same command with a real budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deepinfer import LLM, EngineConfig, SamplingParams, SpeculativeConfig
from deepinfer.models import default_model_path, load_model
from deepinfer.speculative import SHIPPED_DRAFTER

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "dspark_smollm2" / "train_drafter.py"


def test_recipe_resumes_the_shipped_drafter_and_exports_a_working_checkpoint(
    tmp_path: Path,
) -> None:
    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    if not (SHIPPED_DRAFTER / "config.json").exists():
        pytest.skip("no shipped drafter checkpoint")
    work, out = tmp_path / "run", tmp_path / "export"
    tiny = ["--seq-len", "32", "--batch-size", "1", "--anchors", "4", "--reuse", "1"]
    evaluation = ["--eval-prompts", "1", "--eval-tokens", "4", "--threads", "1"]
    cmd = [
        sys.executable,
        str(RECIPE),
        "--work-dir",
        str(work),
        "--init-from",
        str(SHIPPED_DRAFTER),
    ]
    cmd += ["--max-steps", "2", *tiny, *evaluation, "--export", "--export-dir", str(out)]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert json.loads((work / "trainer_state.json").read_text())["step"] == 2
    evaluated = json.loads((work / "eval.json").read_text())
    assert set(evaluated["eval"]) == {"T=0.0", "T=1.0"}
    assert evaluated["eval"]["T=0.0"]["tau"] >= 1.0
    assert json.loads((out / "sts.json").read_text()).keys() == {"greedy", "sampling"}
    shipped = json.loads((SHIPPED_DRAFTER / "config.json").read_text())
    assert json.loads((out / "config.json").read_text())["dspark"] == shipped["dspark"]

    loaded = load_model()
    cfg = EngineConfig(num_blocks=64, max_num_seqs=2)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = "def add(a, b):\n    return"
    plain = LLM(loaded, engine_config=cfg, enable_prefix_caching=False)
    spec = LLM(
        loaded,
        engine_config=cfg,
        enable_prefix_caching=False,
        speculative=SpeculativeConfig(str(out), num_speculative_tokens=2, draft_gate=False),
    )
    want = plain.generate([prompt], params)[0].token_ids
    assert spec.generate([prompt], params)[0].token_ids == want
    stats = spec.engine.speculator.stats  # type: ignore[union-attr]
    assert stats.num_verified > 0
