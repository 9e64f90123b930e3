"""deepinfer.builder.build_engine_from_settings: the one translation of a worker's or a
replica's JSON settings into build_engine (PD workers and serve replicas both use it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer import EngineConfig, SamplingParams
from deepinfer.builder import BuiltEngine, build_engine, build_engine_from_settings
from deepinfer.engine.cache_setup import PrefixCacheConfig

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config(max_position_embeddings=256, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("builder") / "tiny.gguf"
    return write_tiny_gguf(path, cfg, random_hf_state(cfg, seed=5))


def _run(built: BuiltEngine) -> list[int]:
    try:
        engine = built.engine
        engine.add_request([3, 4, 5, 6], GREEDY, request_id="r")
        tokens: list[int] = []
        while engine.has_unfinished():
            for out in engine.step():
                tokens += out.new_token_ids
        return tokens
    finally:
        built.close()


def test_settings_build_the_engine_the_objects_build(gguf_path: Path, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    built = build_engine_from_settings(
        str(gguf_path),
        engine={"num_blocks": 24, "max_num_seqs": 2, "seed": 3},
        cache={"device_blocks": 4, "directory": str(kv), "directory_suffix": "-worker-1"},
        speculative="",
        cache_dir=str(tmp_path / "models"),
    )
    assert built.engine.config == EngineConfig(num_blocks=24, max_num_seqs=2, seed=3)
    assert built.engine.speculator is None  # "" (a replica's default) means no speculation
    assert built.store is not None
    # The suffix names this engine's own disk directory; the shared name is left alone.
    assert (tmp_path / "kv-worker-1").is_dir() and not kv.exists()
    got = _run(built)
    want = _run(
        build_engine(
            str(gguf_path),
            engine_config=EngineConfig(num_blocks=24, max_num_seqs=2, seed=3),
            prefix_cache=PrefixCacheConfig(device_blocks=4, directory=str(tmp_path / "kv2")),
            cache_dir=str(tmp_path / "models"),
        )
    )
    assert len(got) == GREEDY.max_tokens and got == want


def test_no_cache_and_defaults(gguf_path: Path, tmp_path: Path) -> None:
    built = build_engine_from_settings(str(gguf_path), cache_dir=str(tmp_path))
    assert built.store is None and built.engine.prefix_cache is None
    assert built.engine.config == EngineConfig()
    built.close()


def test_unknown_fields_are_named(gguf_path: Path, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="num_blockz"):
        build_engine_from_settings(str(gguf_path), engine={"num_blockz": 4})
    with pytest.raises(TypeError, match="device_blockz"):
        build_engine_from_settings(
            str(gguf_path), engine={"num_blocks": 16}, cache={"device_blockz": 2}
        )
    with pytest.raises(ValueError, match="dtype"):
        build_engine_from_settings(str(gguf_path), dtype="int8", cache_dir=str(tmp_path))
