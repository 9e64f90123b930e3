"""The ``deepinfer-sched simulate`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _sim_traces import small_trace

from deepinfer_sched.cli import main
from deepinfer_sched.traces import save_jsonl


def _config(tmp_path: Path) -> Path:
    cfg = {
        "num_instances": 3,
        "num_prefill": 1,
        "kv_capacity_tokens": 50_000,
        "ttft_slo_s": 1.0,
        "tpot_slo_s": 0.05,
        "faults": [{"time_s": 0.5, "instance_id": 2}],
        "scheduler": {"router": "cost", "pd": "disaggregated", "batch": {"max_num_seqs": 8}},
    }
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


def test_simulate_file_trace_writes_report_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = small_trace(50, 20.0, seed=3)
    save_jsonl(trace, tmp_path / "t.jsonl")
    out = tmp_path / "out"
    rc = main(
        [
            "simulate",
            "--config",
            str(_config(tmp_path)),
            "--trace",
            str(tmp_path / "t.jsonl"),
            "--block-size",
            "16",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["report"]["num_requests"] == 50
    assert doc["config"]["scheduler"]["router"] == "cost"
    assert doc["report"]["num_completed"] == 50
    # The configured fault (instance 2 at 0.5 s) has work in flight: it is rerouted, not lost.
    assert doc["simulator"]["rerouted"] > 0
    for m in ("ttft", "tpot", "e2e"):
        assert (out / f"{m}_cdf.png").stat().st_size > 1000
    assert "goodput" in capsys.readouterr().out


def test_simulate_synthetic_is_deterministic(tmp_path: Path) -> None:
    docs = []
    for run in ("a", "b"):
        out = tmp_path / run
        rc = main(
            [
                "simulate",
                "--trace",
                "synthetic",
                "--requests",
                "40",
                "--rate",
                "2",
                "--seed",
                "5",
                "--out",
                str(out),
                "--no-plots",
                "--no-progress",
            ]
        )
        assert rc == 0
        docs.append((out / "report.json").read_text())
    assert docs[0] == docs[1]


def test_bad_config_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"scheduler": {"router": "nope"}}))
    rc = main(
        [
            "simulate",
            "--config",
            str(bad),
            "--trace",
            "synthetic",
            "--requests",
            "5",
            "--out",
            str(tmp_path / "o"),
            "--no-plots",
            "--no-progress",
        ]
    )
    assert rc == 2
    assert "router" in capsys.readouterr().err
    bad.write_text("{not json")
    rc = main(
        ["simulate", "--config", str(bad), "--trace", "synthetic", "--out", str(tmp_path / "o")]
    )
    assert rc == 2
