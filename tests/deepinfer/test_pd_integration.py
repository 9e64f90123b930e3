"""PD mode on the real embedded model: greedy output equals the colocated engine's."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.models import default_model_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Write one sentence about the sea, then one about mountains. " * 4,
]


def test_pd_greedy_matches_colocated_on_smollm2(tmp_path: Path) -> None:
    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    engine = EngineConfig(num_blocks=64, max_model_len=512)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with LLM(engine_config=engine, enable_prefix_caching=False) as colocated:
        want = colocated.generate(PROMPTS, params)
    # The prefill worker's prefix cache keeps its disk tier next to tmp_path/kv, not in ~/.cache.
    cache = PrefixCacheConfig(device_blocks=8, directory=str(tmp_path / "kv"))
    with LLM(engine_config=engine, pd=True, prefix_cache_config=cache) as pd:
        got = pd.generate(PROMPTS, params)
        assert pd.pd is not None
        workers = pd.pd.workers
    for g, w in zip(got, want):
        assert g.error is None
        assert g.token_ids == w.token_ids and g.text == w.text
    assert all(not p.process.is_alive() for p in workers)
