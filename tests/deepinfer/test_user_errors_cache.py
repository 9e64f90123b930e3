"""A damaged converted model is rebuilt; unusable cache directories degrade with a warning."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer.engine.cache_setup import PrefixCacheConfig, build_prefix_cache
from deepinfer.models.convert import MARKER, convert_gguf, is_converted
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.loader import load_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], Path]:
    cfg = tiny_config()
    state = random_hf_state(cfg, seed=3)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return state, write_tiny_gguf(path, cfg, state)


def _fingerprint(directory: Path) -> dict[str, object]:
    recorded = json.loads((directory / MARKER).read_text())
    recorded.pop("files")
    return dict(recorded)


def test_marker_records_every_converted_file(tiny, tmp_path: Path) -> None:
    _, path = tiny
    out = convert_gguf(path, tmp_path)
    files = json.loads((out / MARKER).read_text())["files"]
    assert set(files) == {p.name for p in out.iterdir() if p.name != MARKER}
    assert all(len(digest) == 64 for digest in files.values())
    assert is_converted(out, _fingerprint(out))
    (out / "blocks.safetensors").write_bytes(b"another loader's own file")
    assert is_converted(out, _fingerprint(out))  # files beside the conversion are not its own


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "marker"])
def test_damaged_conversion_is_detected_and_rebuilt(tiny, tmp_path: Path, damage: str) -> None:
    state, path = tiny
    out = convert_gguf(path, tmp_path)
    weights = out / "model.safetensors"
    original = weights.read_bytes()
    if damage == "flip":  # one bit in the middle of the tensor data, size unchanged
        data = bytearray(original)
        data[len(data) // 2] ^= 0x10
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(original[: len(original) // 3])
    elif damage == "delete":
        (out / "tokenizer.json").unlink()
    else:
        (out / MARKER).write_text("{not json")
    # bf16: the weights come from the converted model.safetensors itself.
    loaded = load_model(path, cache_dir=tmp_path, dtype=torch.bfloat16)
    assert loaded.path == out
    assert weights.read_bytes() == original
    assert (out / "tokenizer.json").is_file()
    expected = state["model.embed_tokens.weight"].to(torch.bfloat16)
    assert torch.equal(loaded.model.embed_tokens.weight, expected)


def test_unwritable_model_cache_converts_elsewhere_with_a_warning(
    tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, path = tiny
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # works for root too, unlike chmod
    with pytest.warns(RuntimeWarning, match="not writable"):
        loaded = load_model(path, cache_dir=blocker / "models")
    assert loaded.path.is_relative_to(tmp_path / "tmp")
    assert loaded.config.vocab_size == tiny_config().vocab_size


def _pool() -> KVPool:
    return KVPool(2, 16, 4, 2, 8, dtype=torch.float32)


def test_unusable_disk_tier_directory_runs_without_the_disk_tier(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    config = PrefixCacheConfig(device_blocks=2, host_bytes=1 << 16, directory=str(blocker / "kv"))
    with pytest.warns(RuntimeWarning, match="no disk tier"):
        adapter, store = build_prefix_cache(_pool(), config, "key")
    assert [type(t).__name__ for t in store.tiers] == ["DeviceTier", "HostTier"]
    store.close()
    assert adapter is not None


def test_full_disk_at_start_runs_without_the_disk_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("deepinfer_cache.config.SegmentDiskTier", full)
    config = PrefixCacheConfig(device_blocks=2, host_bytes=1 << 16, directory=str(tmp_path))
    with pytest.warns(RuntimeWarning, match="No space left"):
        _, store = build_prefix_cache(_pool(), config, "key")
    assert len(store.tiers) == 2
    store.close()
