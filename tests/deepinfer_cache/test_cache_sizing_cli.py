from __future__ import annotations

import doctest
import importlib
import json

import pytest

from deepinfer_cache import REFERENCE_MODELS, ModelKV, ssd_capacity
from deepinfer_cache.cli import main


def test_reference_bytes_per_token() -> None:
    assert REFERENCE_MODELS["llama-3-8b"].bytes_per_token == 128 * 1024
    assert REFERENCE_MODELS["deepseek-v3"].bytes_per_token == (512 + 64) * 61 * 2 == 70272


def test_capacity_formula() -> None:
    r = ssd_capacity(1000, input_tokens_per_day=1e9, hit_rate=0.9, chat_fraction=0.25, overhead=0.0)
    assert r.stored_tokens_per_day == pytest.approx(1e8)
    assert r.mean_retention_days == pytest.approx(0.25 * 7 + 0.75 * 3)
    assert r.capacity_bytes == pytest.approx(1e8 * 1000 * 4.0)
    assert r.write_bandwidth == pytest.approx(1e11 / 86400)
    per_s = ssd_capacity(1000, tokens_per_second=1e9 / 86400, hit_rate=0.9, chat_fraction=0.25)
    assert per_s.stored_tokens_per_day == pytest.approx(1e8)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"input_tokens_per_day": 1.0, "tokens_per_second": 1.0},
        {"input_tokens_per_day": 1.0, "hit_rate": 1.5},
        {"input_tokens_per_day": -1.0},
    ],
)
def test_capacity_rejects_bad_input(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ssd_capacity(100, **kwargs)


def test_model_kv_validation() -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelKV("x", 2)


def test_cli(capsys) -> None:
    assert main(["models"]) == 0
    assert "deepseek-v3" in capsys.readouterr().out
    args = ["size", "--model", "llama-3-8b", "--tokens-per-day", "1e9", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bytes_per_token"] == 131072
    assert main(["size", "--bytes-per-token", "10", "--tokens-per-second", "5"]) == 0
    assert "SSD capacity" in capsys.readouterr().out
    assert (
        main(["size", "--bytes-per-token", "10", "--tokens-per-second", "5", "--hit-rate", "2"])
        == 2
    )


@pytest.mark.parametrize(
    "module",
    [
        "hashing",
        "index",
        "retention",
        "store",
        "adapter",
        "sizing",
        "tiers.device",
        "tiers.host",
        "block_hash_chain",
    ],
)
def test_docstring_examples(module: str) -> None:
    mod = importlib.import_module(f"deepinfer_cache.{module}")
    res = doctest.testmod(mod)
    assert res.attempted > 0 and res.failed == 0
