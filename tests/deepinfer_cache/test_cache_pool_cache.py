"""`build_pool_cache` / `pool_model_key` on their own (no engine): a device tier reserved out of
a paged pool tensor, pages moved by the functions passed in, a save/load round trip, and a model
key that tells layouts apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deepinfer_cache import (
    DeviceTier,
    PrefixCacheConfig,
    build_pool_cache,
    pool_model_key,
    torch_gather,
    torch_scatter,
)

BS = 4
NUM_BLOCKS = 16


def _pool(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # [layers, K/V, blocks, block_size, heads, head_dim], blocks on dim 2 as an engine's pool.
    return torch.zeros(2, 2, NUM_BLOCKS, BS, 2, 8, dtype=dtype)


class _Reserve:
    """Hands out blocks from the top of the pool and remembers what it gave."""

    def __init__(self) -> None:
        self.free = list(range(NUM_BLOCKS))
        self.given: list[int] = []

    def __call__(self, n: int) -> list[int]:
        out = [self.free.pop() for _ in range(n)]
        self.given += out
        return out


def test_device_tier_is_a_reserved_slice_of_the_pool_capped_at_half(tmp_path: Path) -> None:
    pool, reserve = _pool(), _Reserve()
    config = PrefixCacheConfig(device_blocks=100, host_bytes=1 << 20, directory=str(tmp_path))
    _, store = build_pool_cache(config, pool, BS, reserve, model_key="m")
    try:
        device = store.tiers[0]
        assert isinstance(device, DeviceTier)
        assert len(reserve.given) == NUM_BLOCKS // 2  # never more than half the pool
        assert device.capacity_bytes == len(reserve.given) * device.page_bytes
        assert [t.name for t in store.tiers] == ["device", "host", "disk"]
    finally:
        store.close()


def test_pages_round_trip_through_the_pool_with_the_given_movers(tmp_path: Path) -> None:
    pool, reserve = _pool(), _Reserve()
    calls = {"gather": 0, "scatter": 0}

    def gather(p: torch.Tensor, ids: torch.Tensor, *, block_dim: int = 0) -> torch.Tensor:
        calls["gather"] += 1
        return torch_gather(p, ids, block_dim=block_dim)

    def scatter(
        p: torch.Tensor, ids: torch.Tensor, src: torch.Tensor, *, block_dim: int = 0
    ) -> None:
        calls["scatter"] += 1
        torch_scatter(p, ids, src, block_dim=block_dim)

    config = PrefixCacheConfig(device_blocks=4, host_bytes=1 << 20, disk_bytes=0)
    adapter, store = build_pool_cache(
        config, pool, BS, reserve, model_key="m", gather_fn=gather, scatter_fn=scatter
    )
    try:
        tokens = list(range(3 * BS))
        src_blocks = [0, 1, 2]
        pool[:, :, src_blocks] = torch.randn(2, 2, 3, BS, 2, 8)
        assert adapter.save(tokens, b"", src_blocks) == 3  # blocks stored
        assert adapter.num_cached_tokens(tokens) == 3 * BS
        dst_blocks = [5, 6, 7]
        assert adapter.load(tokens, b"", dst_blocks) == 3 * BS
        assert torch.equal(pool[:, :, dst_blocks], pool[:, :, src_blocks])
        assert calls["gather"] > 0 and calls["scatter"] > 0
        assert not set(reserve.given) & set(src_blocks + dst_blocks)
    finally:
        store.close()


def test_no_device_blocks_reserves_nothing(tmp_path: Path) -> None:
    reserve = _Reserve()
    config = PrefixCacheConfig(device_blocks=0, host_bytes=1 << 20, disk_bytes=0)
    _, store = build_pool_cache(config, _pool(), BS, reserve, model_key="m")
    try:
        assert reserve.given == [] and [t.name for t in store.tiers] == ["host"]
    finally:
        store.close()


def test_model_key_tells_models_and_layouts_apart() -> None:
    key = pool_model_key("model-a", _pool(), BS)
    assert len(key) == 16 and key == pool_model_key("model-a", _pool(), BS)
    others = {
        pool_model_key("model-b", _pool(), BS),
        pool_model_key("model-a", _pool(torch.bfloat16), BS),
        pool_model_key("model-a", _pool(), BS * 2),
        pool_model_key("model-a", torch.zeros(2, 2, NUM_BLOCKS, BS, 4, 8), BS),
    }
    assert key not in others and len(others) == 4
    # The number of blocks is not part of the layout: a bigger pool reads the same pages.
    assert pool_model_key("model-a", torch.zeros(2, 2, 64, BS, 2, 8), BS) == key


def test_a_config_without_tiers_is_refused_by_name() -> None:
    config = PrefixCacheConfig(device_blocks=0, host_bytes=0, disk_bytes=0)
    with pytest.raises(ValueError, match="config"):
        build_pool_cache(config, _pool(), BS, _Reserve(), model_key="m")
