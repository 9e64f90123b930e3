"""The engine's prefix cache with ONE tier: host-only, and disk-only across a restart.

What `benchmarks/engine_ttft_cache.py` times, checked for correctness: with no device tier the
cached prefix comes straight from host memory, or from block files a closed engine left behind,
into the engine pool, and greedy output is the same as a cold run's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from model_helpers import greedy_paged, random_hf_state, tiny_config, write_tiny_gguf

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.engine.cache_setup import PrefixCacheConfig, build_engine_kv
from deepinfer.models import load_model
from deepinfer.models.loader import LoadedModel
from deepinfer_cache import CacheLockedError

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
CFG = EngineConfig(block_size=8, num_blocks=48)
PREFIX_LEN = 43  # not a block multiple: only its 5 full blocks (40 tokens) are cacheable


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    cfg = tiny_config(max_position_embeddings=256)
    root = tmp_path_factory.mktemp("tiers")
    path = write_tiny_gguf(root / "tiny.gguf", cfg, random_hf_state(cfg, seed=5))
    return load_model(path, cache_dir=root / "models")


def _prompts(vocab: int) -> tuple[list[int], list[int]]:
    """Two prompts sharing a 43-token prefix and differing after it."""
    prefix = [(11 * j + 5) % vocab for j in range(PREFIX_LEN)]
    first = prefix + [(3 * j + 1) % vocab for j in range(9)]
    second = prefix + [(5 * j + 7) % vocab for j in range(13)]
    assert first[PREFIX_LEN] != second[PREFIX_LEN]
    return first, second


def _cold(loaded: LoadedModel, prompt: list[int]) -> list[int]:
    llm = LLM(loaded, engine_config=CFG, enable_prefix_caching=False)
    out = llm.generate([prompt], GREEDY)[0]
    assert out.metrics is not None and out.metrics.num_cached_tokens == 0
    assert out.token_ids == greedy_paged(loaded.model, prompt, GREEDY.max_tokens)
    return out.token_ids


def test_host_only_cache_serves_the_prefix(loaded: LoadedModel) -> None:
    first, second = _prompts(loaded.config.vocab_size)
    cache = PrefixCacheConfig(device_blocks=0, host_bytes=1 << 20, disk_bytes=0)
    with LLM(loaded, engine_config=CFG, prefix_cache_config=cache) as llm:
        assert llm.store is not None
        assert [t.name for t in llm.store.tiers] == ["host"]
        # No device tier: the engine keeps its whole pool.
        assert llm.engine.capacity_blocks == CFG.num_blocks
        seed = llm.generate([first], GREEDY)[0]
        hit = llm.generate([second], GREEDY)[0]
        host = llm.store.stats().tiers[0]
    assert seed.metrics is not None and seed.metrics.num_cached_tokens == 0
    assert hit.metrics is not None and hit.metrics.num_cached_tokens == 40
    assert host.hit_blocks == 5
    assert hit.token_ids == _cold(loaded, second)
    assert seed.token_ids == _cold(loaded, first)


def test_disk_only_cache_serves_the_prefix_after_a_restart(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    first, second = _prompts(loaded.config.vocab_size)
    cache = PrefixCacheConfig(
        device_blocks=0, host_bytes=0, disk_bytes=1 << 22, directory=str(tmp_path / "kv")
    )
    with LLM(loaded, engine_config=CFG, prefix_cache_config=cache) as writer:
        assert writer.store is not None
        assert [t.name for t in writer.store.tiers] == ["disk"]
        seed = writer.generate([first], GREEDY)[0]
    assert seed.metrics is not None and seed.metrics.num_cached_tokens == 0
    assert any((tmp_path / "kv" / "segments").glob("*.seg")), "the writer left no segments"

    # A fresh engine over the same directory: the only copy of the prefix is on disk.
    with LLM(loaded, engine_config=CFG, prefix_cache_config=cache) as restarted:
        assert restarted.store is not None
        hit = restarted.generate([second], GREEDY)[0]
        disk = restarted.store.stats().tiers[0]
    assert hit.metrics is not None and hit.metrics.num_cached_tokens == 40
    assert disk.hit_blocks == 5
    assert disk.bytes_read > 0  # served from block files, not from memory
    assert hit.token_ids == _cold(loaded, second)


def test_second_engine_on_a_locked_default_directory_runs_without_disk(
    loaded: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two engines on one machine: the one that finds the default disk directory held starts
    with device and host tiers and a warning; an explicitly named directory raises."""
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    first, _ = _prompts(loaded.config.vocab_size)
    with LLM(loaded, engine_config=CFG) as owner:
        assert owner.store is not None and "disk" in [t.name for t in owner.store.tiers]
        with pytest.warns(RuntimeWarning, match="no disk tier"):
            other = LLM(loaded, engine_config=CFG)
        with other:
            assert other.store is not None
            assert [t.name for t in other.store.tiers] == ["device", "host"]
            assert other.generate([first], GREEDY)[0].token_ids == _cold(loaded, first)
        disk_dir = next(p for p in (tmp_path / "kv").iterdir() if p.is_dir())
        named = PrefixCacheConfig(device_blocks=0, host_bytes=0, directory=str(disk_dir))
        with pytest.raises(CacheLockedError):
            LLM(loaded, engine_config=CFG, prefix_cache_config=named)


def test_directory_suffix_gives_a_sibling_directory_with_the_same_lock_rules(
    loaded: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PD prefill workers share one cache configuration and take suffixed siblings of its disk
    directory; a held default sibling falls back to memory tiers, a held named one raises."""
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    cache = PrefixCacheConfig(device_blocks=0, host_bytes=1 << 20)
    _, _, owner = build_engine_kv(
        loaded.model, CFG, cache, str(loaded.path), directory_suffix="-pd-prefill-0"
    )
    assert owner is not None
    disk = owner.tiers[-1]
    assert disk.name == "disk"
    default = next(p for p in (tmp_path / "kv").iterdir() if p.name.endswith("-pd-prefill-0"))
    assert (default / ".lock").is_file()
    with pytest.warns(RuntimeWarning, match="no disk tier"):
        _, _, second = build_engine_kv(
            loaded.model, CFG, cache, str(loaded.path), directory_suffix="-pd-prefill-0"
        )
    assert second is not None and [t.name for t in second.tiers] == ["host"]
    named = PrefixCacheConfig(device_blocks=0, host_bytes=0, directory=str(tmp_path / "mine"))
    _, _, first_named = build_engine_kv(
        loaded.model, CFG, named, str(loaded.path), directory_suffix="-pd-prefill-1"
    )
    assert first_named is not None and (tmp_path / "mine-pd-prefill-1" / ".lock").is_file()
    with pytest.raises(CacheLockedError):
        build_engine_kv(
            loaded.model, CFG, named, str(loaded.path), directory_suffix="-pd-prefill-1"
        )
    for store in (owner, second, first_named):
        store.close()
