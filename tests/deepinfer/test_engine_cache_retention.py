"""The engine saves a request's prefix-cache blocks under the retention class its
`SamplingParams(retention=...)` names (#20 item 6): chat by default, agent where asked."""

from __future__ import annotations

import dataclasses

import pytest
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.models import load_model
from deepinfer.models.loader import LoadedModel

if "retention" not in {f.name for f in dataclasses.fields(SamplingParams)}:
    pytest.skip("SamplingParams has no retention field in this tree", allow_module_level=True)

CFG = EngineConfig(block_size=8, num_blocks=48)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    cfg = tiny_config(max_position_embeddings=256)
    root = tmp_path_factory.mktemp("retention")
    path = write_tiny_gguf(root / "tiny.gguf", cfg, random_hf_state(cfg, seed=3))
    return load_model(path, cache_dir=root / "models")


def test_retention_class_flows_from_sampling_params_to_the_store(loaded: LoadedModel) -> None:
    vocab = loaded.config.vocab_size
    chat = [(7 * j + 1) % vocab for j in range(24)]
    agent = [(13 * j + 2) % vocab for j in range(24)]
    cache = PrefixCacheConfig(device_blocks=0, host_bytes=1 << 20, disk_bytes=0)
    with LLM(loaded, engine_config=CFG, prefix_cache_config=cache) as llm:
        assert llm.store is not None
        base = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        llm.generate([chat], base)
        llm.generate([agent], dataclasses.replace(base, retention="agent"))
        store = llm.store
        for prompt, cls in ((chat, "chat"), (agent, "agent")):
            hashes = store.lookup(prompt, record=False).hashes
            assert hashes, "the prompt's blocks were saved"
            assert {store.index.retention_of(h) for h in hashes} == {cls}
    with pytest.raises(ValueError, match="retention"):
        SamplingParams(retention="")
