"""Device-tier prefix hits share the cached blocks by reference count instead of copying."""

from __future__ import annotations

import pytest
import torch
from model_helpers import random_hf_state, tiny_config

from deepinfer import EngineConfig, LLMEngine, SamplingParams
from deepinfer.engine.cache_setup import PrefixCacheConfig, build_prefix_cache
from deepinfer.models import KVPool, LlamaModel, build_model

CFG = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_batched_tokens=64)
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    cfg = tiny_config(max_position_embeddings=256)
    return build_model(cfg, random_hf_state(cfg, seed=5))


def _engine(model: LlamaModel, device_blocks: int):
    pool = KVPool.for_weights(model, CFG.num_blocks, CFG.block_size)
    config = PrefixCacheConfig(device_blocks=device_blocks, host_bytes=0, disk_bytes=0)
    adapter, store = build_prefix_cache(pool, config, "share-test")
    device = store.tiers[0]
    return LLMEngine(model, None, CFG, prefix_cache=adapter, pool=pool), store, device


def _finish(engine: LLMEngine, rid: str) -> list[int]:
    while True:
        for out in engine.step():
            if out.request_id == rid and out.finished:
                return out.token_ids


def _prompt(seed: int, n: int = 14) -> list[int]:
    return torch.randint(3, 60, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_device_hit_reads_the_cached_blocks_in_place(model: LlamaModel) -> None:
    engine, store, device = _engine(model, device_blocks=8)
    try:
        prompt = _prompt(0)
        cold = _finish(engine, engine.add_request(prompt, GREEDY))
        free_before = engine.pool.num_free_blocks
        rid = engine.add_request(prompt, GREEDY)
        engine.step()  # admits the request: its 3 full prompt blocks are the device tier's
        seq = engine.running[0]
        shared = seq.block_ids[:3]
        assert shared == [device.slot_of(h) for h in store.hashes(prompt)[:3]]
        assert all(engine.pool.ref_count(b) == 2 for b in shared)
        # Only the blocks past the prefix came from the free list: no copy was made.
        assert free_before - engine.pool.num_free_blocks == len(seq.block_ids) - 3
        assert seq.metrics.num_cached_tokens == 12
        assert _finish(engine, rid) == cold
        assert all(engine.pool.ref_count(b) == 1 for b in shared)  # the tier's own reference
        assert engine.pool.num_free_blocks == free_before
    finally:
        store.close()


def test_shared_blocks_are_pinned_against_eviction(model: LlamaModel) -> None:
    """The device tier holds exactly one prompt's blocks; while a sequence reads them in
    place, other sequences' saves must not evict or overwrite them."""
    engine, store, device = _engine(model, device_blocks=3)
    try:
        prompt = _prompt(1)
        cold = _finish(engine, engine.add_request(prompt, GREEDY))
        pages = device.pool[:, :, [device.slot_of(h) for h in store.hashes(prompt)[:3]]].clone()
        rid = engine.add_request(prompt, GREEDY)
        engine.step()
        shared = engine.running[0].block_ids[:3]
        # Another conversation finishes and saves its blocks while the first reads the tier.
        other = engine.add_request(_prompt(2), SamplingParams(temperature=0, max_tokens=1))
        _finish(engine, other)
        assert torch.equal(device.pool[:, :, shared], pages)
        assert _finish(engine, rid) == cold
    finally:
        store.close()


def test_a_partial_device_hit_copies_as_before(model: LlamaModel) -> None:
    """Blocks split over tiers (here: the device tier lost the last one) are loaded by copy;
    nothing stays pinned."""
    pool = KVPool.for_weights(model, CFG.num_blocks, CFG.block_size)
    config = PrefixCacheConfig(device_blocks=2, host_bytes=1 << 20, disk_bytes=0)
    adapter, store = build_prefix_cache(pool, config, "share-test-partial")
    engine = LLMEngine(model, None, CFG, prefix_cache=adapter, pool=pool)
    try:
        prompt = _prompt(3)
        cold = _finish(engine, engine.add_request(prompt, GREEDY))
        rid = engine.add_request(prompt, GREEDY)
        engine.step()
        seq = engine.running[0]
        assert seq.metrics.num_cached_tokens == 12
        assert all(pool.ref_count(b) == 1 for b in seq.block_ids)
        assert _finish(engine, rid) == cold
    finally:
        store.close()
