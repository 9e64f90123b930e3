"""Roofline cost model: data files, hand-checked formulas, monotonicity (hypothesis)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_sched.costmodel import (
    CostModel,
    HardwareSpec,
    ModelSpec,
    RooflineCostModel,
    available_hardware,
    available_models,
    load_hardware,
    load_model,
)

H800 = load_hardware("h800")
MODELS = {name: load_model(name) for name in ("dense-8b", "dense-70b", "deepseek-v3")}
GPUS = {"dense-8b": 1, "dense-70b": 4, "deepseek-v3": 16}


def test_shipped_data_files() -> None:
    assert available_hardware() == ["h200", "h800"]
    assert available_models() == ["deepseek-v3", "dense-70b", "dense-8b"]
    h200 = load_hardware("h200")
    assert h200.hbm_bandwidth > H800.hbm_bandwidth
    assert h200.hbm_capacity_bytes > H800.hbm_capacity_bytes


def test_kv_bytes_per_token() -> None:
    # GQA: layers * 2 (K and V) * kv_heads * head_dim * 2 bytes.
    assert MODELS["dense-8b"].kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    assert MODELS["dense-70b"].kv_bytes_per_token == 80 * 2 * 8 * 128 * 2
    # MLA: layers * (512 latent + 64 rope) * 2 bytes.
    assert MODELS["deepseek-v3"].kv_bytes_per_token == 61 * (512 + 64) * 2
    cm = RooflineCostModel(H800, MODELS["dense-8b"])
    assert cm.kv_bytes_per_token == 131_072 and isinstance(cm.kv_bytes_per_token, int)


def test_moe_params_touched() -> None:
    v3 = MODELS["deepseek-v3"]
    assert v3.is_moe
    assert v3.params_touched(1) == pytest.approx(v3.active_params, rel=0.05)
    assert v3.params_touched(4096) == pytest.approx(v3.total_params, rel=1e-3)
    assert v3.params_touched(8) < v3.params_touched(64)
    dense = MODELS["dense-8b"]
    assert dense.params_touched(1) == dense.params_touched(1000) == dense.total_params


def test_prefill_formula_by_hand() -> None:
    m = MODELS["dense-8b"]
    cm = RooflineCostModel(H800, m, mfu=0.5, hbm_efficiency=0.8, step_overhead_s=0.001)
    n, c = 4096, 10_000
    attn = 2 * 32 * 32 * (128 + 128)
    flops = 2 * m.active_params * n + attn * (n * c + n * (n + 1) / 2)
    expected = flops / (989e12 * 0.5) + 0.001  # compute-bound at this size
    assert cm.prefill_time(n, c) == pytest.approx(expected, rel=1e-12)
    assert cm.prefill_time(0, 5000) == 0.0
    # Small prefills are memory-bound: at least one read of the weights.
    assert cm.prefill_time(1) >= m.total_params * 2 / (3.35e12 * 0.8)


def test_decode_formula_by_hand() -> None:
    m = MODELS["dense-70b"]
    cm = RooflineCostModel(H800, m, num_gpus=4, hbm_efficiency=0.8, step_overhead_s=0.002)
    b, t = 32, 32 * 8000
    mem = (m.total_params * 2 + t * m.kv_bytes_per_token) / (3.35e12 * 0.8 * 4)
    assert cm.decode_step_time(b, t) == pytest.approx(mem + 0.002, rel=1e-12)
    assert cm.decode_step_time(0, 0) == 0.0


def test_transfer_ssd_capacity() -> None:
    m = MODELS["dense-8b"]
    cm = RooflineCostModel(H800, m, num_gpus=2)
    bytes_ = 1000 * m.kv_bytes_per_token
    assert cm.kv_transfer_time(1000) == pytest.approx(20e-6 + bytes_ / (50e9 * 2))
    assert cm.ssd_fetch_time(1000) == pytest.approx(200e-6 + bytes_ / (5e9 * 2))
    assert cm.kv_transfer_time(0) == cm.ssd_fetch_time(0) == 0.0
    cap = cm.kv_capacity_tokens(0.9)
    assert cap == int((80e9 * 0.9 * 2 - m.total_params * 2) // m.kv_bytes_per_token)
    with pytest.raises(ValueError, match="do not fit"):
        RooflineCostModel(H800, MODELS["deepseek-v3"], num_gpus=1).kv_capacity_tokens()
    assert isinstance(cm, CostModel)


def test_more_gpus_is_faster() -> None:
    m = MODELS["dense-70b"]
    one = RooflineCostModel(H800, m, num_gpus=1)
    eight = RooflineCostModel(H800, m, num_gpus=8, step_overhead_s=0.0)
    assert eight.prefill_time(8192, 0) < one.prefill_time(8192, 0) / 4
    assert eight.decode_step_time(16, 16_000) < one.decode_step_time(16, 16_000)


@given(
    st.sampled_from(sorted(MODELS)),
    st.integers(1, 200_000),
    st.integers(0, 200_000),
    st.integers(1, 5000),
)
def test_prefill_monotone(name: str, n: int, c: int, extra: int) -> None:
    cm = RooflineCostModel(H800, MODELS[name], num_gpus=GPUS[name])
    t = cm.prefill_time(n, c)
    assert t > 0.0
    assert cm.prefill_time(n + extra, c) > t  # more new tokens cost more
    assert cm.prefill_time(n, c + extra) >= t  # a longer cached prefix costs no less
    # Serving the cached prefix from cache beats recomputing it.
    assert cm.prefill_time(n, c) <= cm.prefill_time(n + c, 0)


@given(
    st.sampled_from(sorted(MODELS)),
    st.integers(1, 512),
    st.integers(0, 10_000_000),
    st.integers(1, 64),
)
def test_decode_monotone(name: str, b: int, t: int, extra: int) -> None:
    cm = RooflineCostModel(H800, MODELS[name], num_gpus=GPUS[name])
    base = cm.decode_step_time(b, t)
    assert base > cm.step_overhead_s
    assert cm.decode_step_time(b + extra, t) >= base
    assert cm.decode_step_time(b, t + extra * 1000) > base
    # Batching amortises the weights: per-sequence time falls with batch size.
    assert cm.decode_step_time(b + extra, t) / (b + extra) < base / b


@given(st.integers(0, 10_000_000), st.integers(0, 10_000_000))
def test_transfer_monotone(a: int, b: int) -> None:
    cm = RooflineCostModel(H800, MODELS["dense-8b"])
    lo, hi = sorted((a, b))
    assert cm.kv_transfer_time(lo) <= cm.kv_transfer_time(hi)
    assert cm.ssd_fetch_time(lo) <= cm.ssd_fetch_time(hi)


def test_validation_and_custom_files(tmp_path: Path) -> None:
    m = MODELS["dense-8b"]
    for kw in ({"mfu": 0.0}, {"mfu": 1.5}, {"hbm_efficiency": -1.0}, {"num_gpus": 0}):
        with pytest.raises(ValueError):
            RooflineCostModel(H800, m, **kw)
    with pytest.raises(ValueError, match="new_tokens"):
        RooflineCostModel(H800, m).prefill_time(-1)
    with pytest.raises(ValueError, match="batch_size"):
        RooflineCostModel(H800, m).decode_step_time(2.5, 10)  # type: ignore[arg-type]
    np_tokens: int = np.int64(64)  # type: ignore[assignment]  # numpy ints are accepted too
    assert RooflineCostModel(H800, m).prefill_time(np_tokens) == pytest.approx(
        RooflineCostModel(H800, m).prefill_time(64)
    )
    with pytest.raises(ValueError, match="peak_flops"):
        HardwareSpec(
            "x", peak_flops=0.0, hbm_bandwidth=1.0, hbm_capacity_bytes=1.0, link_bandwidth=1.0
        )
    with pytest.raises(ValueError, match="attention"):
        ModelSpec("x", 1, 8, 1, 1, 8, 1e6, 1e6, attention="linear")
    with pytest.raises(ValueError, match="expert layout"):
        ModelSpec(
            "x", 1, 8, 1, 1, 8, 100e9, 50e9, num_experts=8, experts_per_token=1, expert_params=80e9
        )
    spec = {
        "name": "tiny",
        "peak_flops": 1e12,
        "hbm_bandwidth": 1e11,
        "hbm_capacity_bytes": 8e9,
        "link_bandwidth": 1e9,
    }
    (tmp_path / "tiny.json").write_text(json.dumps(spec))
    assert load_hardware(tmp_path / "tiny.json").peak_flops == 1e12
    (tmp_path / "bad.json").write_text(json.dumps({**spec, "colour": "red"}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_hardware(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="invalid JSON"):
        load_model(tmp_path / "broken.json")
    with pytest.raises(ValueError, match="neither a shipped name"):
        load_model("no-such-model")
