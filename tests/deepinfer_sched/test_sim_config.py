"""SimConfig validation and JSON round trip."""

from __future__ import annotations

import json

import pytest

from deepinfer_sched.policies import BatchConfig, SchedulerConfig
from deepinfer_sched.sim import Fault, SimConfig, SpecDecodeConfig


def test_round_trip_through_json() -> None:
    cfg = SimConfig(
        scheduler=SchedulerConfig(
            router="prefix_affinity",
            pd="disaggregated",
            batch=BatchConfig(max_num_seqs=7),
            admission=("rate_limit",),
            default_rate_limit=(1.0, 2.0),
        ),
        num_instances=5,
        num_prefill=2,
        spec=SpecDecodeConfig(gamma=3, alpha=0.5),
        faults=(Fault(1.5, 4),),
        ssd_capacity_blocks=10,
    )
    again = SimConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"num_instances": 0}, "num_instances"),
        ({"scheduler": SchedulerConfig(pd="disaggregated"), "num_prefill": 0}, "num_prefill"),
        (
            {"scheduler": SchedulerConfig(pd="per_request"), "num_instances": 2, "num_prefill": 2},
            "num_prefill",
        ),
        ({"kv_capacity_tokens": 0}, "kv_capacity_tokens"),
        ({"ttft_slo_s": 0.0}, "ttft_slo_s"),
        ({"faults": (Fault(1.0, 8),)}, "instance_id"),
        ({"ssd_capacity_blocks": -1}, "ssd_capacity_blocks"),
    ],
)
def test_bad_values_raise(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimConfig(**kw)  # type: ignore[arg-type]


def test_bad_nested_values_raise() -> None:
    with pytest.raises(ValueError, match="gamma"):
        SpecDecodeConfig(gamma=0)
    with pytest.raises(ValueError, match="alpha"):
        SpecDecodeConfig(alpha=1.5)
    with pytest.raises(ValueError, match="time_s"):
        Fault(float("nan"), 0)
    with pytest.raises(ValueError, match="unknown SimConfig keys"):
        SimConfig.from_dict({"num_instance": 3})
    with pytest.raises(TypeError, match="scheduler"):
        SimConfig(scheduler={"router": "cost"})  # type: ignore[arg-type]
