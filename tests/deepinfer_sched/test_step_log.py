"""deepinfer_sched.costmodel.step_log: live step logs written as profiles load_profile reads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from deepinfer_sched.costmodel import (
    PROFILE_FORMAT,
    StepLog,
    fit_profile,
    load_profile,
    profile_header,
    write_profile,
)


def _header() -> dict[str, object]:
    return profile_header({"model": "m"}, kv_bytes_per_token=1024, kv_capacity_tokens=16384)


def test_a_written_live_log_loads_and_fits_back_to_its_step_model(tmp_path: Path) -> None:
    log = StepLog()
    # step = 0.01 + 5e-5 per prefill token + 2e-4 per decoding sequence + 1e-6 per KV token
    for i in range(40):
        n, b, t = 16 * (i % 5), i % 7 or 1, 100 * (i % 3) + 10 * i
        log.add_step([(n, 0)] if n else [], b, t, 0.01 + 5e-5 * n + 2e-4 * b + 1e-6 * t)
    log.request(1.0, 1.5, 2.0, 48, 16)
    path = tmp_path / "sub" / "live.json"
    write_profile(log.live_profile(_header()), path)
    data = load_profile(path)
    assert data["format"] == PROFILE_FORMAT and data["version"] == 1
    assert len(data["steps"]) == len(log) == 40
    assert data["requests"] == [[1.0, 1.5, 2.0, 48, 16]]
    cm = fit_profile(data)
    assert cm.step_overhead_s == pytest.approx(0.01, rel=1e-3)
    assert cm.decode_coef[1:] == pytest.approx((2e-4, 1e-6), rel=1e-3)
    assert cm.prefill_coef[1] == pytest.approx(5e-5, rel=1e-3)


def test_steps_without_work_or_time_are_not_kept_and_the_buffer_is_bounded() -> None:
    log = StepLog(max_steps=3)
    log.add_step([], 0, 0, 0.5)  # no work
    log.add_step([(4, 0)], 0, 0, 0.0)  # no measurable time
    log.add_step([(4, 0)], 0, 0, math.nan)
    assert len(log) == 0
    for k in range(5):
        log.add_step([], 1, 10 + k, 0.1)
    steps = log.live_profile(_header())["steps"]
    assert [s["context_tokens"] for s in steps] == [12, 13, 14]  # the oldest dropped out


def test_bad_arguments_name_themselves(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_steps"):
        StepLog(max_steps=0)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        profile_header({}, kv_bytes_per_token=8, kv_capacity_tokens=0)
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        profile_header({}, kv_bytes_per_token=True, kv_capacity_tokens=8)
    # A value JSON cannot hold leaves neither the file nor its temporary behind.
    target = tmp_path / "p.json"
    with pytest.raises(ValueError):
        write_profile({**_header(), "steps": [{"seconds": math.inf}]}, target)
    assert list(tmp_path.iterdir()) == []
    # An earlier good file survives a failed rewrite whole.
    write_profile(_header(), target)
    with pytest.raises(TypeError):
        write_profile({"x": object()}, target)
    assert json.loads(target.read_text())["format"] == PROFILE_FORMAT
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]
