"""``SimConfig.cache_publish``: when a request's prompt blocks become prefix hits."""

from __future__ import annotations

import pytest

from deepinfer_sched.costmodel import FittedCostModel
from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.sim import SimConfig, run_simulation
from deepinfer_sched.traces import Trace, TraceRequest

CM = FittedCostModel((0.01, 1e-4, 0.0), (0.01, 1e-3, 0.0), 1024, 1 << 16)
HASHES = tuple(range(1, 9))  # 8 blocks of 16 tokens


def _run(publish: str, arrival_b: float, max_num_seqs: int = 8) -> list[int]:
    trace = Trace(
        (
            TraceRequest(0, 0.0, 130, 20, HASHES, "t", 0),
            TraceRequest(1, arrival_b, 130, 2, HASHES, "t", 1),
        ),
        16,
    )
    config = SimConfig(
        SchedulerConfig(router="round_robin", batch=BatchConfig(max_num_seqs, 2048, True)),
        num_instances=1,
        kv_capacity_tokens=4096,
        cache_publish=publish,
    )
    res = run_simulation(trace, config, 0, cost_model=CM)
    return [r.cached_tokens for r in sorted(res.records, key=lambda r: r.request_id)]


def test_blocks_are_hits_after_prefill_or_only_after_the_request_ends() -> None:
    # B arrives while A decodes (A's prefill took ~23 ms, its 19 decode steps ~0.2 s).
    assert _run("prefill", 0.1) == [0, 128]
    assert _run("finish", 0.1) == [0, 0]
    # After A has ended, both modes hit.
    assert _run("finish", 1.0) == [0, 128]


def test_finish_mode_looks_the_prefix_up_again_at_admission() -> None:
    # One sequence at a time: B queues behind A and is admitted when A has ended (and
    # published its blocks), so the admission-time lookup finds them, as the engine does.
    assert _run("finish", 0.001, max_num_seqs=1) == [0, 128]


def test_cache_publish_is_validated() -> None:
    with pytest.raises(ValueError, match="cache_publish"):
        SimConfig(cache_publish="later")
