from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_cache import BlockMeta, DeviceTier, HostTier, Tier, torch_gather, torch_scatter

META = BlockMeta(None, "chat", 0.0)


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def engine_pool(blocks: int = 6) -> torch.Tensor:
    # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim], block_dim = 2
    return torch.zeros(3, 2, blocks, 4, 2, 5)


def test_tiers_satisfy_the_protocol(tmp_path) -> None:
    from deepinfer_cache import DiskTier

    d = DiskTier(tmp_path, (2, 3), torch.float32, 1 << 16)
    for t in (DeviceTier(torch.zeros(2, 2, 3)), HostTier((2, 3), torch.float32, 1024), d):
        assert isinstance(t, Tier)
    d.close()


def test_device_tier_over_an_engine_pool_with_reserved_blocks() -> None:
    pool = engine_pool()
    tier = DeviceTier(pool, block_dim=2, block_ids=[4, 5])
    assert tier.page_shape == (3, 2, 4, 2, 5)
    assert tier.capacity_bytes == 2 * tier.page_bytes
    p0, p1 = torch.randn(3, 2, 4, 2, 5), torch.randn(3, 2, 4, 2, 5)
    assert tier.put(key(0), p0, META) and tier.put(key(1), p1, META)
    assert not tier.has_room() and not tier.put(key(2), p0, META)
    # The pages live in the reserved engine blocks, nowhere else.
    assert {tier.slot_of(key(0)), tier.slot_of(key(1))} == {4, 5}
    assert torch.equal(pool[:, :, tier.slot_of(key(0))], p0)
    assert pool[:, :, :4].abs().sum() == 0
    got = tier.get_many([key(1), key(0)])
    assert got is not None and torch.equal(got[0], p1) and torch.equal(got[1], p0)
    tier.delete(key(0))
    assert key(0) not in tier and tier.get(key(0)) is None and tier.has_room()


def test_device_tier_uses_the_injected_page_movers() -> None:
    calls: list[str] = []

    def gather(pool, ids, *, block_dim=0):
        calls.append(f"gather{block_dim}")
        return torch_gather(pool, ids, block_dim=block_dim)

    def scatter(pool, ids, src, *, block_dim=0):
        calls.append(f"scatter{block_dim}")
        torch_scatter(pool, ids, src, block_dim=block_dim)

    tier = DeviceTier(engine_pool(), block_dim=2, gather_fn=gather, scatter_fn=scatter)
    page = torch.randn(tier.page_shape)
    tier.put(key(7), page, META)
    assert torch.equal(tier.get(key(7)), page)
    assert calls == ["scatter2", "gather2"]


@given(st.lists(st.integers(0, 9), min_size=1, max_size=30))
def test_host_tier_round_trips_like_a_dict(ops: list[int]) -> None:
    tier = HostTier((3,), torch.float64, capacity_bytes=4 * 24)
    model: dict[bytes, torch.Tensor] = {}
    for i in ops:
        k = key(i)
        if k in model and i % 2:
            tier.delete(k)
            del model[k]
            continue
        page = torch.full((3,), float(i), dtype=torch.float64)
        ok = tier.put(k, page, META)
        assert ok == (k in model or len(model) < 4)
        if ok:
            model[k] = page
        assert len(tier) == len(model) and tier.used_bytes() == 24 * len(model)
    for k, v in model.items():
        assert torch.equal(tier.get(k), v)


def test_bad_tier_arguments() -> None:
    with pytest.raises(ValueError, match="block_dim"):
        DeviceTier(torch.zeros(2, 3), block_dim=2)
    with pytest.raises(ValueError, match="block_ids"):
        DeviceTier(torch.zeros(2, 3), block_ids=[0, 0])
    with pytest.raises(ValueError, match="capacity_bytes"):
        HostTier((2,), torch.float32, -1)
    tier = HostTier((2,), torch.float32, 64)
    with pytest.raises(ValueError, match="shape"):
        tier.put(key(0), torch.zeros(3), META)
    with pytest.raises(TypeError, match="dtype"):
        tier.put(key(0), torch.zeros(2, dtype=torch.float64), META)
    with pytest.raises(TypeError, match="key"):
        tier.put(b"short", torch.zeros(2), META)
