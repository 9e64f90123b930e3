"""`PrefixCacheConfig` + `build_store` used on their own (no engine): the tiers the config names,
the default and suffixed disk directories, the lock rules, key material, and bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_cache import (
    CacheLockedError,
    DeviceTier,
    PrefixCacheConfig,
    SegmentDiskTier,
    TieredKVStore,
    build_store,
    default_kv_directory,
)

PAGE = (2, 4, 2, 8)  # [K/V, block_size, heads, head_dim]
BS = 4
TOKENS = list(range(5 * BS))


def _build(config: PrefixCacheConfig, key: str = "model-a", **kw: object) -> TieredKVStore:
    return build_store(config, PAGE, torch.float32, BS, model_key=key, **kw)  # type: ignore[arg-type]


def _pages(n: int, seed: int) -> torch.Tensor:
    return torch.randn((n, *PAGE), generator=torch.Generator().manual_seed(seed))


def test_host_and_disk_store_round_trips_and_survives_a_reopen(tmp_path: Path) -> None:
    config = PrefixCacheConfig(device_blocks=0, host_bytes=1 << 20, directory=str(tmp_path / "kv"))
    store = _build(config)
    assert [t.name for t in store.tiers] == ["host", "disk"]
    assert isinstance(store.tiers[1], SegmentDiskTier)
    pages = _pages(5, seed=1)
    store.store(TOKENS, pages)
    assert store.flush()
    store.close()
    # A new store over the same directory (a restarted engine) hits from disk alone.
    reopened = _build(PrefixCacheConfig(device_blocks=0, host_bytes=0, directory=config.directory))
    try:
        got = reopened.fetch(TOKENS).result()
        assert got.num_blocks == 5
        torch.testing.assert_close(got.stacked(), pages)
    finally:
        reopened.close()


def test_device_tier_of_its_own_or_the_callers() -> None:
    own = _build(PrefixCacheConfig(device_blocks=3, host_bytes=0, disk_bytes=0))
    tier = own.tiers[0]
    assert [t.name for t in own.tiers] == ["device"]
    assert isinstance(tier, DeviceTier) and tier.capacity_bytes == 3 * tier.page_bytes
    own.store(TOKENS, _pages(5, seed=2))
    assert own.lookup(TOKENS).num_tokens == 3 * BS  # three pages fit, the rest are dropped
    own.close()
    pool = torch.zeros((10, *PAGE))
    given_tier = DeviceTier(pool, block_ids=[7, 8])
    store = _build(
        PrefixCacheConfig(device_blocks=2, host_bytes=0, disk_bytes=0), device_tier=given_tier
    )
    assert store.tiers == [given_tier]
    store.close()


def test_default_directory_is_under_the_cache_dir_and_takes_the_suffix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    assert default_kv_directory("m1") == tmp_path / "kv" / "m1"
    config = PrefixCacheConfig(device_blocks=0, host_bytes=0)
    store = _build(config, key="m1", directory_suffix="-pd-prefill-0")
    assert (tmp_path / "kv" / "m1-pd-prefill-0" / ".lock").is_file()
    # The default directory held by another store: built without a disk tier, with a warning.
    with pytest.warns(RuntimeWarning, match="no disk tier"):
        second = _build(
            PrefixCacheConfig(device_blocks=0, host_bytes=1 << 16),
            key="m1",
            directory_suffix="-pd-prefill-0",
        )
    assert [t.name for t in second.tiers] == ["host"]
    # A directory named in the config raises instead.
    named = PrefixCacheConfig(device_blocks=0, host_bytes=0, directory=str(tmp_path / "kv" / "m1"))
    with pytest.raises(CacheLockedError):
        _build(named, directory_suffix="-pd-prefill-0")
    store.close()
    second.close()


def test_unusable_directory_leaves_out_the_disk_tier(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")  # a file where a directory's parent should be
    config = PrefixCacheConfig(device_blocks=0, host_bytes=1 << 16, directory=str(blocker / "kv"))
    with pytest.warns(RuntimeWarning, match="not usable"):
        store = _build(config)
    assert [t.name for t in store.tiers] == ["host"]
    store.close()


def test_keys_follow_the_model_key_model_id_and_key_extra(tmp_path: Path) -> None:
    def hits(writer: PrefixCacheConfig, wkey: str, reader: PrefixCacheConfig, rkey: str) -> int:
        directory = str(tmp_path / f"kv{len(list(tmp_path.iterdir()))}")
        w = _build(PrefixCacheConfig(**{**vars(writer), "directory": directory}), key=wkey)
        w.store(TOKENS, _pages(5, seed=3))
        assert w.flush()
        w.close()
        r = _build(PrefixCacheConfig(**{**vars(reader), "directory": directory}), key=rkey)
        try:
            return r.lookup(TOKENS).num_tokens
        finally:
            r.close()

    base = PrefixCacheConfig(device_blocks=0, host_bytes=0)
    named = PrefixCacheConfig(device_blocks=0, host_bytes=0, model_id="weights@sha256:ab")
    salted = PrefixCacheConfig(device_blocks=0, host_bytes=0, key_extra="lora:7")
    assert hits(base, "a", base, "a") == len(TOKENS)
    assert hits(base, "a", base, "b") == 0  # another model never sees this one's KV
    assert hits(named, "a", named, "b") == len(TOKENS)  # one model_id shares across paths
    assert hits(base, "a", salted, "a") == 0
    assert PrefixCacheConfig().key_material("a") == b"a"  # keys written before key_extra hold


# Printable names: an identity holding raw length-prefix bytes could imitate a prefixed pair.
_NAME = st.text(alphabet="ab:@-7", min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(st.tuples(_NAME, _NAME | st.just("")), st.tuples(_NAME, _NAME | st.just("")))
def test_key_material_tells_identity_and_extra_pairs_apart(
    a: tuple[str, str], b: tuple[str, str]
) -> None:
    ka = PrefixCacheConfig(model_id=a[0], key_extra=a[1]).key_material("unused")
    kb = PrefixCacheConfig(model_id=b[0], key_extra=b[1]).key_material("unused")
    assert (ka == kb) == (a == b)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"device_blocks": -1}, ValueError, "device_blocks"),
        ({"host_bytes": -1}, ValueError, "host_bytes"),
        ({"disk_bytes": -5}, ValueError, "disk_bytes"),
        ({"disk_format": "blocks"}, ValueError, "disk_format"),
        ({"key_hash": "sha1"}, ValueError, "sha1"),
        ({"model_id": ""}, ValueError, "model_id"),
        ({"key_extra": b"lora"}, TypeError, "key_extra"),
    ],
)
def test_bad_config_values_are_named(kwargs: dict, error: type, name: str) -> None:
    with pytest.raises(error, match=name):
        PrefixCacheConfig(**kwargs)


def test_bad_build_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="model_key"):
        _build(PrefixCacheConfig(device_blocks=0, disk_bytes=0), key="")
    with pytest.raises(ValueError, match="at least one tier"):
        _build(PrefixCacheConfig(device_blocks=0, host_bytes=0, disk_bytes=0))
