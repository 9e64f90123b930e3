"""`deepinfer serve --profile-out`: replicas record the steps they serve (a live step profile)
and `deepinfer-sched calibrate` fits the simulator's cost model to those records."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import thread_server, tiny_model

from deepinfer import EngineConfig
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.serve import ServeConfig
from deepinfer.serve.replica import replica_profile_path
from deepinfer_sched.cli import main as sched_main
from deepinfer_sched.costmodel import FittedCostModel, load_profile, merge_profiles

MODEL = "tiny"
# A small step budget: long prompts prefill in chunks, mixed with other requests' decodes.
ENGINE = EngineConfig(
    block_size=8, num_blocks=96, max_model_len=256, max_num_seqs=8, max_batched_tokens=24
)


def _chat(base: str, i: int) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are agent zero. Tools: read write search."},
            {"role": "user", "content": f"question {i}: " + "why " * i},
        ],
        "max_tokens": 4 + i % 3,
        "temperature": 0,
        "ignore_eos": True,
        "user": "tenant-a",
    }
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json()["usage"])


def test_replica_profile_path_names_each_replica() -> None:
    assert replica_profile_path("out/live.json", 1) == "out/live-replica-1.json"
    assert replica_profile_path("live", 0) == "live-replica-0.json"
    assert replica_profile_path(None, 0) is None
    with pytest.raises(ValueError, match="profile_out"):
        ServeConfig(profile_out="")


def test_live_profile_records_every_served_token_and_calibrates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = tiny_model(tmp_path)
    out = tmp_path / "prof" / "live.json"
    config = ServeConfig(
        model=str(gguf),
        served_model_name=MODEL,
        replicas=2,
        in_process=True,
        router="round_robin",
        engine=ENGINE,
        prefix_cache=PrefixCacheConfig(device_blocks=24, host_bytes=1 << 22, disk_bytes=0),
        cache_dir=str(tmp_path / "cache"),
        profile_out=str(out),
    )
    with thread_server(config) as base:
        with ThreadPoolExecutor(6) as pool:
            usages = list(pool.map(lambda i: _chat(base, i), range(10)))
        assert not list(out.parent.glob("*.json")), "the profile is written on shutdown"
    files = [Path(replica_profile_path(str(out), i) or "") for i in range(2)]
    profiles = [load_profile(f) for f in files]
    steps = [s for p in profiles for s in p["steps"]]
    requests = [r for p in profiles for r in p["requests"]]
    # Exact accounting: every prompt token computed (not served from the prefix cache) was in
    # some step's prefill chunks, and every token after a request's first came from a decode row.
    computed = sum(u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert sum(n for s in steps for n, _ in s["prefill"]) == computed
    assert sum(s["batch_size"] for s in steps) == sum(u["completion_tokens"] - 1 for u in usages)
    assert all(s["seconds"] > 0 for s in steps)
    # Chunked prefill shows as chunks over KV already held; some steps mix prefill and decode.
    assert any(c > 0 for s in steps for _, c in s["prefill"])
    assert max(n for s in steps for n, _ in s["prefill"]) <= ENGINE.max_batched_tokens
    assert any(s["prefill"] and s["batch_size"] for s in steps)
    for s in steps:
        if s["batch_size"]:
            assert s["context_tokens"] >= s["batch_size"] * 8
    # Replica-side request times: one row per request, in order, with its prompt length.
    assert len(requests) == len(usages)
    assert sorted(r[3] for r in requests) == sorted(u["prompt_tokens"] for u in usages)
    assert all(r[0] <= r[1] <= r[2] for r in requests)
    assert profiles[0]["kv_capacity_tokens"] == profiles[1]["kv_capacity_tokens"]
    assert len(merge_profiles(profiles)["steps"]) == len(steps)

    fitted = tmp_path / "cm.json"
    argv = ["calibrate", "--profile", *map(str, files), "--out", str(fitted)]
    assert sched_main(argv) == 0
    assert "live steps" in capsys.readouterr().out
    cm = FittedCostModel.from_json(fitted.read_text())
    assert cm.fit_error["steps"] == len(steps)
    # One per-step term o, shared: a mixed simulator iteration pays it once; a prefill step's
    # fixed cost is o plus its chunk's setup e >= 0 (zero or not, as the measured steps fall).
    assert cm.decode_coef[0] == cm.step_overhead_s <= cm.prefill_coef[0]
    assert cm.decode_step_time(2, 100) > 0 and cm.prefill_time(16, 0) > 0
    # Least squares with a per-step term matches the summed time (what sets throughput).
    assert json.loads(fitted.read_text())["fit_error"]["steps_total_rel"] < 0.05
