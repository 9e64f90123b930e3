"""DSpark in the engine on the real embedded model with the shipped drafter: lossless greedy."""

from __future__ import annotations

import pytest

from deepinfer import LLM, EngineConfig, SamplingParams, SpeculativeConfig
from deepinfer.models import LoadedModel, default_model_path, load_model
from deepinfer.speculative import SHIPPED_DRAFTER

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [
    "def add(a, b):\n    return",
    "The capital of France is",
    "import os\nimport sys\n\n\ndef main():\n",
]


@pytest.fixture(scope="module")
def smol() -> LoadedModel:
    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    if not (SHIPPED_DRAFTER / "config.json").exists():
        pytest.skip("no shipped drafter checkpoint")
    return load_model()


def test_shipped_drafter_greedy_is_lossless_on_the_real_model(smol: LoadedModel) -> None:
    cfg = EngineConfig(num_blocks=128, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = LLM(smol, engine_config=cfg, enable_prefix_caching=False)
    # A fixed verify count and no gate: with the default policy, whether drafting pays (the
    # target profiled at start-up, the gate's measured step times) depends on the machine's
    # load, and a loaded CI runner may verify no draft for some prompt. Drafting on every
    # step makes "drafts were verified" a fact of the code, not of the machine's speed.
    forced = SpeculativeConfig("dspark", num_speculative_tokens=3, draft_gate=False)
    spec = LLM(smol, engine_config=cfg, enable_prefix_caching=False, speculative=forced)
    want = [o.token_ids for o in plain.generate(PROMPTS, params)]
    got = spec.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == want
    assert all(o.metrics is not None and o.metrics.num_spec_steps > 0 for o in got)
    stats = spec.engine.speculator.stats  # type: ignore[union-attr]
    assert stats.num_rows > 0 and stats.mean_accepted_length >= 1.0
