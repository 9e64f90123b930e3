"""The engine's disk tier format: "segments" by default, "files" on request, and a directory
left in the "files" format by an older engine converted in place (or refused, naming the
command), never ignored or deleted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deepinfer.cli import build_parser
from deepinfer.engine.cache_setup import PrefixCacheConfig, build_prefix_cache
from deepinfer.models.kv_pool import KVPool
from deepinfer.serve.server import config_from_args
from deepinfer_cache import CacheFormatError, DiskTier, SegmentDiskTier

BS = 4


def _pool() -> KVPool:
    return KVPool(2, 16, BS, 2, 8, dtype=torch.float32)


def _config(directory: Path, **kw: object) -> PrefixCacheConfig:
    return PrefixCacheConfig(device_blocks=0, host_bytes=0, directory=str(directory), **kw)  # type: ignore[arg-type]


TOKENS = list(range(6 * BS))


def _pages(pool: KVPool, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = tuple(pool.tensor.select(2, 0).shape)
    return torch.randn((n, *shape), generator=g, dtype=pool.tensor.dtype)


def _write(directory: Path, **kw: object) -> torch.Tensor:
    pool = _pool()
    _, store = build_prefix_cache(pool, _config(directory, **kw), "model-a")
    pages = _pages(pool, 6, seed=1)
    store.store(TOKENS, pages)
    assert store.flush()
    store.close()
    return pages


def _served(directory: Path, **kw: object) -> torch.Tensor:
    _, store = build_prefix_cache(_pool(), _config(directory, **kw), "model-a")
    try:
        got = store.fetch(TOKENS).result()
        assert got.num_blocks == 6
        return got.stacked()
    finally:
        store.close()


def test_segments_by_default_files_on_request(tmp_path: Path) -> None:
    for fmt, cls in ((None, SegmentDiskTier), ("files", DiskTier), ("segments", SegmentDiskTier)):
        kw = {} if fmt is None else {"disk_format": fmt}
        _, store = build_prefix_cache(_pool(), _config(tmp_path / str(fmt), **kw), "k")
        assert [type(t) for t in store.tiers] == [cls]
        store.close()
    assert PrefixCacheConfig().disk_format == "segments"
    with pytest.raises(ValueError, match="disk_format"):
        PrefixCacheConfig(disk_format="blocks")


def test_an_older_engines_files_directory_is_converted_in_place(tmp_path: Path) -> None:
    pages = _write(tmp_path / "kv", disk_format="files")
    assert any((tmp_path / "kv" / "blocks").rglob("*"))
    with pytest.warns(RuntimeWarning, match=r"converted .*\(6 blocks copied"):
        got = _served(tmp_path / "kv")
    assert torch.equal(got, pages)
    assert not (tmp_path / "kv" / "blocks").exists()
    assert torch.equal(_served(tmp_path / "kv"), pages)  # and stays served, no warning now


def test_conversion_off_or_the_wrong_format_is_refused_with_the_way_out(tmp_path: Path) -> None:
    pages = _write(tmp_path / "old", disk_format="files")
    with pytest.raises(CacheFormatError, match="deepinfer-cache migrate"):
        build_prefix_cache(_pool(), _config(tmp_path / "old", migrate_disk=False), "model-a")
    assert torch.equal(_served(tmp_path / "old", disk_format="files"), pages)  # untouched

    _write(tmp_path / "new")
    with pytest.raises(CacheFormatError, match="'segments' format"):
        build_prefix_cache(_pool(), _config(tmp_path / "new", disk_format="files"), "model-a")


def test_cli_flags_choose_the_format(tmp_path: Path) -> None:
    parser = build_parser()
    serve = parser.parse_args(["serve", "--cache-disk-format", "files", "--in-process"])
    cfg = config_from_args(serve)
    assert cfg.prefix_cache is not None and cfg.prefix_cache.disk_format == "files"
    default = config_from_args(parser.parse_args(["serve", "--in-process"]))
    assert default.prefix_cache is not None and default.prefix_cache.disk_format == "segments"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--cache-disk-format", "blocks"])
