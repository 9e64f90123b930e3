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


def test_step_recorder_logs_each_step_as_prefill_chunks_and_a_decode_batch(
    tmp_path: Path,
) -> None:
    from deepinfer import SamplingParams
    from deepinfer.profile import StepRecorder

    engine = _engine()
    rec = StepRecorder()
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request(list(range(3, 23)), params)  # 20 prompt tokens
    engine.add_request(list(range(30, 37)), params)  # 7
    steps = 0
    while engine.has_unfinished():
        engine.step()
        rec.record(engine.last_chunks, 0.01)
        steps += 1
    rec.record([], 0.01)  # an idle step is not a step
    prof = rec.profile(engine, "tiny")
    assert len(rec) == steps == 3
    first, *decodes = prof["steps"]
    assert sorted(first["prefill"]) == [[7, 0], [20, 0]] and first["batch_size"] == 0
    # Each decode step: both sequences, holding their prompt and the tokens out so far.
    assert [(s["prefill"], s["batch_size"], s["context_tokens"]) for s in decodes] == [
        ([], 2, 27 + 2),
        ([], 2, 27 + 4),
    ]
    path = tmp_path / "live.json"
    write_profile(prof, path)
    assert load_profile(path)["engine"]["model"] == "tiny"
