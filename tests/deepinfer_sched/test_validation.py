"""Bad configs and traces fail up front with a message naming the field and the row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _sched_fakes import LinearCost

from deepinfer_sched.cli import main
from deepinfer_sched.policies import SchedulerConfig
from deepinfer_sched.report import SLO
from deepinfer_sched.sim import SimConfig, Simulator, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest, load_trace, rechain

CM = LinearCost()


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(ts: float, ids: list[int], n: int = 64) -> dict[str, object]:
    return {"timestamp": ts, "input_length": n, "output_length": 4, "hash_ids": ids}


def test_non_chained_hash_ids_name_the_line(tmp_path: Path) -> None:
    # Block 7 follows block 1 on line 1 and block 2 on line 2: not a chain.
    p = _jsonl(tmp_path / "t.jsonl", [_row(0, [1, 7]), _row(1, [2, 7])])
    with pytest.raises(ValueError, match=r"t\.jsonl:2: hash_ids\[1\] = 7"):
        load_trace(p, block_size=32)
    trace = load_trace(p, block_size=32, rechain=True)
    assert trace[0].block_hashes[1] != trace[1].block_hashes[1]
    run_simulation(trace, SimConfig(num_instances=1, kv_capacity_tokens=1000), 0, CM)


def test_non_chained_trace_object_fails_before_simulating() -> None:
    reqs = (TraceRequest(0, 0.0, 64, 2, (1, 7)), TraceRequest(5, 1.0, 64, 2, (2, 7)))
    with pytest.raises(ValueError, match=r"request 1 \(request_id 5\): hash_ids\[1\] = 7"):
        Simulator(Trace(reqs, 32), SimConfig(num_instances=1, kv_capacity_tokens=1000), 0, CM)
    fixed = Trace(rechain(reqs), 32)
    assert fixed[0].block_hashes[0] != fixed[1].block_hashes[0]


def test_repeated_ids_in_one_request_are_an_error_or_rechained(tmp_path: Path) -> None:
    # [5, 5] would make block 1 look cached as soon as block 0 is: a fake hit.
    p = _jsonl(tmp_path / "r.jsonl", [_row(0, [5, 5]), _row(1000, [5, 6])])
    with pytest.raises(ValueError, match=r"r\.jsonl:1: hash_ids: .*block_hashes\[1\] = 5 repeats"):
        load_trace(p, block_size=32)
    with pytest.raises(ValueError, match="repeats"):
        TraceRequest(0, 0.0, 64, 1, (5, 5))
    trace = load_trace(p, block_size=32, rechain=True)
    a, b = trace[0].block_hashes, trace[1].block_hashes
    assert len(set(a)) == 2 and a[0] == b[0] and a[1] != b[1]
    recs = run_simulation(trace, SimConfig(num_instances=1, kv_capacity_tokens=1000), 0, CM)
    assert recs.records[1].cached_tokens == 32  # only the genuinely shared first block


def test_empty_trace_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="no requests"):
        Simulator(Trace((), 16), SimConfig(), 0, CM)
    (tmp_path / "e.jsonl").write_text("")
    rc = main(["simulate", "--trace", str(tmp_path / "e.jsonl"), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "no requests" in capsys.readouterr().err
    assert not (tmp_path / "o" / "report.json").exists()


@pytest.mark.parametrize(
    ("data", "exc", "match"),
    [
        ({"ttft_slo_s": float("inf")}, ValueError, r"SimConfig\.ttft_slo_s must be finite"),
        ({"tpot_slo_s": float("nan")}, ValueError, r"SimConfig\.tpot_slo_s"),
        ({"num_instances": "4"}, TypeError, r"SimConfig\.num_instances must be an integer"),
        ({"num_instances": 4.0}, TypeError, r"SimConfig\.num_instances"),
        ({"num_prefill": True}, TypeError, r"SimConfig\.num_prefill"),
        ({"fast_forward": "yes"}, TypeError, r"SimConfig\.fast_forward"),
        ({"kv_memory_fraction": 2.0}, ValueError, r"SimConfig\.kv_memory_fraction"),
        ({"scheduler": {"admission": "ttft"}}, TypeError, r"SchedulerConfig\.admission .*'ttft'"),
        ({"scheduler": {"router_seed": "1"}}, TypeError, r"SchedulerConfig\.router_seed"),
        ({"scheduler": {"prefill_weight": "x"}}, TypeError, r"SchedulerConfig\.prefill_weight"),
        ({"scheduler": {"batch": {"max_num_seqs": "8"}}}, TypeError, r"BatchConfig\.max_num_seqs"),
        ({"scheduler": {"batch": {"max_seqs": 8}}}, ValueError, r"batch keys: \['max_seqs'\]"),
        ({"scheduler": {"rate_limits": {"a": [1]}}}, TypeError, r"rate_limits\['a'\]"),
        ({"scheduler": "cost"}, TypeError, r"SimConfig\.scheduler must be an object"),
        ({"spec": {"gamma": "5"}}, TypeError, r"SpecDecodeConfig\.gamma"),
        ({"faults": [{"time_s": 1.0}]}, ValueError, r"SimConfig\.faults\[0\]"),
        ({"faults": [{"time_s": 1.0, "instance_id": "2"}]}, TypeError, r"Fault\.instance_id"),
    ],
)
def test_bad_config_values_name_the_field(
    data: dict[str, object], exc: type[Exception], match: str
) -> None:
    with pytest.raises(exc, match=match):
        SimConfig.from_dict(data)


def test_cli_reports_an_infinite_slo_without_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text('{"ttft_slo_s": Infinity}')
    out = str(tmp_path / "o")
    args = ["simulate", "--config", str(cfg), "--trace", "synthetic", "--requests", "5"]
    rc = main([*args, "--out", out, "--no-plots", "--no-progress"])
    assert rc == 2
    assert "ttft_slo_s must be finite" in capsys.readouterr().err


def test_slo_and_scheduler_config_reject_infinity() -> None:
    with pytest.raises(ValueError, match=r"SLO\.ttft_s must be finite"):
        SLO(float("inf"), 1.0)
    with pytest.raises(ValueError, match=r"SchedulerConfig\.ttft_slo_s must be finite"):
        SchedulerConfig(admission=("ttft",), ttft_slo_s=float("inf"))
