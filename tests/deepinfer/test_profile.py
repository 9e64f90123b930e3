"""deepinfer.profile: an engine's step profile, readable and fittable by deepinfer_sched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_helpers import tiny_config

from deepinfer import EngineConfig, LLMEngine
from deepinfer.models import LlamaModel
from deepinfer.profile import profile_engine, write_profile
from deepinfer_sched.costmodel import fit_profile, load_profile


def _engine() -> LLMEngine:
    torch.manual_seed(0)
    model = LlamaModel(tiny_config(max_position_embeddings=512)).eval()
    return LLMEngine(model, None, EngineConfig(num_blocks=96, max_num_seqs=8))


def test_profile_times_prefill_and_decode_and_fits(tmp_path: Path) -> None:
    engine = _engine()
    prof = profile_engine(
        engine,
        prefill_lens=(8, 32, 64, 128),
        batch_sizes=(1, 2, 4),
        context_lens=(16, 64),
        decode_steps=2,
        repeats=1,
    )
    assert not engine.has_unfinished()
    assert [r["new_tokens"] for r in prof["prefill"]] == [8, 32, 64, 128]
    assert {(r["batch_size"]) for r in prof["decode"]} == {1, 2, 4}
    for r in prof["decode"]:
        assert len(r["seconds"]) == 2 and all(s > 0 for s in r["seconds"])
        assert r["context_tokens"] >= r["batch_size"] * 16
    assert prof["kv_capacity_tokens"] == engine.capacity_blocks * 16
    assert prof["kv_bytes_per_token"] == 2 * 2 * 2 * 8 * 4  # K+V, 2 layers, 2 heads x 8, fp32
    path = tmp_path / "p" / "profile.json"
    write_profile(prof, path)
    loaded = load_profile(path)
    assert loaded == json.loads(path.read_text())
    cm = fit_profile(loaded)
    assert cm.prefill_time(64, 0) > 0 and cm.decode_step_time(2, 100) > 0


def test_sizes_the_engine_cannot_hold_are_skipped_and_busy_engines_refused() -> None:
    engine = _engine()
    prof = profile_engine(
        engine, prefill_lens=(16, 4096), batch_sizes=(1, 64), context_lens=(16,), repeats=1
    )
    assert [r["new_tokens"] for r in prof["prefill"]] == [16]
    assert [r["batch_size"] for r in prof["decode"]] == [1]
    from deepinfer import SamplingParams

    engine.add_request([5, 6, 7], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="idle engine"):
        profile_engine(engine)
