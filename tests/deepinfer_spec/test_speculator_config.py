"""`SpeculativeConfig` and `load_speculator`: a ready `BatchSpeculator` from a checkpoint
directory (drafter, STS temperatures, measured policy) or a drafter; bad values named."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from conftest import make_drafter

from deepinfer_spec import (
    BatchSpeculator,
    DraftGate,
    FixedGammaScheduler,
    PrefixScheduler,
    SpeculativeConfig,
    SPSCurve,
    load_speculator,
)
from deepinfer_spec.training import save_drafter


def _curve(sizes: Sequence[int]) -> SPSCurve:
    return SPSCurve(list(sizes), [1e3 / b for b in sizes])


def test_checkpoint_gives_the_drafter_its_temperatures_and_the_measured_policy(
    target, tmp_path: Path
) -> None:
    drafter = make_drafter(target)
    save_drafter(drafter, tmp_path)
    gamma = drafter.config.gamma
    (tmp_path / "sts.json").write_text(
        json.dumps({"greedy": [2.0] * gamma, "sampling": [0.5] * gamma})
    )
    asked: list[tuple[int, ...]] = []

    def profile(sizes: Sequence[int]) -> SPSCurve:
        asked.append(tuple(sizes))
        return _curve(sizes)

    spec = load_speculator(tmp_path, target, profile, max_seqs=4, dtype=torch.bfloat16)
    assert isinstance(spec, BatchSpeculator)
    assert spec.drafter.context_proj.weight.dtype == torch.bfloat16
    for (name, a), (_, b) in zip(drafter.state_dict().items(), spec.drafter.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16), b), name
    assert spec.sts_greedy is not None and spec.sts_greedy.tolist() == [2.0] * gamma
    assert spec.sts_sampling is not None and spec.sts_sampling.tolist() == [0.5] * gamma
    assert (
        isinstance(spec.scheduler, PrefixScheduler) and len(asked) == 1
    )  # curve reused by the gate
    assert isinstance(spec.gate, DraftGate)


def test_a_drafter_object_takes_the_fixed_count_and_no_gate(target) -> None:
    drafter = make_drafter(target)

    def never(sizes: Sequence[int]) -> SPSCurve:
        raise AssertionError("a fixed count without a priced gate needs no profile")

    spec = load_speculator(drafter, target, never, max_seqs=2, num_speculative_tokens=2, gate=None)
    assert spec.drafter is drafter and spec.sts_greedy is None and spec.gate is None
    assert isinstance(spec.scheduler, FixedGammaScheduler)


def test_not_a_checkpoint_and_bad_config_values_are_named(target, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"drafter: directory: .*no config\.json"):
        load_speculator(tmp_path / "missing", target, _curve, max_seqs=1)
    with pytest.raises(ValueError, match="model"):
        SpeculativeConfig("")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig("dspark", num_speculative_tokens=-1)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig("dspark", num_speculative_tokens=True)
    with pytest.raises(ValueError, match="draft_gate"):
        SpeculativeConfig("dspark", draft_gate="yes")  # type: ignore[arg-type]
    config = SpeculativeConfig(tmp_path, 3, False)
    assert config.model == str(tmp_path)
    assert SpeculativeConfig(**json.loads(json.dumps(config.to_dict()))) == config
