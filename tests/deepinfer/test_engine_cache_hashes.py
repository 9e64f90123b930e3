"""The engine keeps each sequence's block hashes (#20): its hashes equal the store's keys for the
same tokens, and lookups, loads, shares and saves through the engine hash no block twice."""

from __future__ import annotations

from typing import Any

import pytest
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.models import load_model
from deepinfer.models.loader import LoadedModel
from deepinfer_cache import BlockHashChain, KVCacheAdapter, TieredKVStore, store_keys, store_reads

BS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
CFG = EngineConfig(block_size=BS, num_blocks=64)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    cfg = tiny_config(max_position_embeddings=256)
    root = tmp_path_factory.mktemp("hashes")
    path = write_tiny_gguf(root / "tiny.gguf", cfg, random_hf_state(cfg, seed=7))
    return load_model(path, cache_dir=root / "models")


@pytest.mark.parametrize("device_blocks", [0, 16], ids=["host", "device-shared"])
def test_engine_hashes_each_block_once_and_like_the_store(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch, device_blocks: int
) -> None:
    chains: list[BlockHashChain] = []
    real_chain = KVCacheAdapter.hash_chain

    def recording_chain(self: KVCacheAdapter, namespace: bytes = b"") -> BlockHashChain:
        chain = real_chain(self, namespace)
        chains.append(chain)
        return chain

    def no_hashing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the store hashed tokens the engine had hashed already")

    monkeypatch.setattr(KVCacheAdapter, "hash_chain", recording_chain)
    vocab = loaded.config.vocab_size
    prefix = [(11 * j + 5) % vocab for j in range(43)]
    prompts = [prefix + [(3 * j + 1) % vocab for j in range(9)], [*prefix, 7, 8, 9]]
    cache = PrefixCacheConfig(device_blocks=device_blocks, host_bytes=1 << 20, disk_bytes=0)
    with LLM(loaded, engine_config=CFG, prefix_cache_config=cache) as llm:
        store = llm.store
        assert isinstance(store, TieredKVStore)
        # Every lookup, load, share and save must read the sequence's chain: the store's
        # own token hashing (hash_chunks for lookups, hash_token_blocks otherwise) is off.
        monkeypatch.setattr(store_reads, "hash_chunks", no_hashing)
        monkeypatch.setattr(store_keys, "hash_token_blocks", no_hashing)
        outs = [llm.generate([p], GREEDY)[0] for p in prompts]
        monkeypatch.undo()
        assert outs[1].metrics is not None and outs[1].metrics.num_cached_tokens == 40
        assert len(chains) == len(prompts)
        for chain, prompt, out in zip(chains, prompts, outs):
            tokens = prompt + out.token_ids
            # Saved at finish: every computed token (all but the last sampled one).
            computed = len(tokens) - 1
            assert chain.hashes == store.hashes(tokens[: computed // BS * BS])
            assert chain.blocks_hashed == computed // BS  # each block once, over 3-4 calls
        assert store.stats().lookups == len(prompts)
