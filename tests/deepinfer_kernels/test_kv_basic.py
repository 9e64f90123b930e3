"""write_kv / gather_blocks / scatter_blocks: torch path == reference loops, validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import (
    gather_blocks_reference,
    scatter_blocks_reference,
    write_kv_reference,
)


@given(
    num_blocks=st.integers(1, 6),
    block_size=st.sampled_from([1, 2, 4, 16]),
    tokens=st.integers(0, 20),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_write_kv_matches_index_assignment(num_blocks, block_size, tokens, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    slots_total = num_blocks * block_size
    tokens = min(tokens, slots_total)
    slots = torch.randperm(slots_total, generator=gen)[:tokens]
    slots = torch.where(torch.rand(tokens, generator=gen) < 0.2, -1, slots)
    k = torch.randn(tokens, 2, 3, generator=gen)
    v = torch.randn(tokens, 2, 5, generator=gen)
    kc = torch.randn(num_blocks, block_size, 2, 3, generator=gen).to(dtype)
    vc = torch.randn(num_blocks, block_size, 2, 5, generator=gen).to(dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    dk.write_kv(k, v, kc, vc, slots)
    write_kv_reference(k, v, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    flat = kc.view(-1, 2, 3)
    keep = slots >= 0
    assert torch.equal(flat[slots[keep]], k[keep].to(dtype))


@given(
    shape=st.sampled_from([(7, 4, 3), (3, 2, 5, 2, 4), (6,)]),
    block_dim=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_gather_scatter_round_trip(shape, block_dim, seed):
    block_dim = min(block_dim, len(shape) - 1)
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(shape, generator=gen)
    nb = shape[block_dim]
    ids = torch.randperm(nb, generator=gen)[: max(1, nb // 2)]
    got = dk.gather_blocks(cache, ids, block_dim=block_dim)
    assert got.is_contiguous()
    assert torch.equal(got, gather_blocks_reference(cache, ids, block_dim))
    other = torch.zeros_like(cache)
    dk.scatter_blocks(other, ids, got, block_dim=block_dim)
    want = torch.zeros_like(cache)
    scatter_blocks_reference(want, ids, got, block_dim)
    assert torch.equal(other, want)
    assert torch.equal(dk.gather_blocks(other, ids, block_dim=block_dim), got)


def test_gather_repeated_ids_and_empty():
    cache = torch.arange(24.0).view(4, 6)
    out = dk.gather_blocks(cache, torch.tensor([2, 2, 0], dtype=torch.int32))
    assert torch.equal(out, cache[[2, 2, 0]])
    assert dk.gather_blocks(cache, torch.zeros(0, dtype=torch.int64)).shape == (0, 6)
    assert dk.gather_blocks(cache, torch.tensor([1]), block_dim=-2).shape == (1, 6)


def test_non_contiguous_pool_is_supported():
    pool = torch.randn(5, 2, 3, 4).transpose(0, 1)  # [2, 5, 3, 4] view, block dim 1
    ids = torch.tensor([4, 0])
    assert torch.equal(dk.gather_blocks(pool, ids, block_dim=1), pool[:, [4, 0]])
    src = torch.randn(2, 2, 3, 4)
    dk.scatter_blocks(pool, ids, src, block_dim=1)
    assert torch.equal(pool[:, [4, 0]], src)


def test_kv_validation():
    kc = torch.zeros(2, 4, 1, 3)
    k = torch.randn(3, 1, 3)
    with pytest.raises(ValueError, match="slot_mapping"):
        dk.write_kv(k, k, kc, kc.clone(), torch.tensor([0, 8, 1]))
    with pytest.raises(ValueError, match="slot_mapping"):
        dk.write_kv(k, k, kc, kc.clone(), torch.tensor([0, -2, 1]))
    with pytest.raises(ValueError, match="twice"):
        dk.write_kv(k, k, kc, kc.clone(), torch.tensor([1, 1, -1]))
    with pytest.raises(ValueError, match="slot_mapping"):
        dk.write_kv(k, k, kc, kc.clone(), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="k:"):
        dk.write_kv(torch.randn(3, 2, 3), k, kc, kc.clone(), torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="slot_mapping"):
        dk.write_kv(k, k, kc, kc.clone(), torch.tensor([0.0, 1.0, 2.0]))
    # Unchecked: an out-of-range slot is skipped, never written out of bounds.
    dk.write_kv(k, k, kc, kc.clone(), torch.tensor([0, 100, 1]), check_values=False)
    assert torch.equal(kc.view(-1, 1, 3)[[0, 1]], k[[0, 2]])
    cache = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="block_ids"):
        dk.gather_blocks(cache, torch.tensor([4]))
    with pytest.raises(ValueError, match="block_ids"):
        dk.scatter_blocks(cache, torch.tensor([1, 1]), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="src"):
        dk.scatter_blocks(cache, torch.tensor([1]), torch.zeros(2, 2))
    with pytest.raises(TypeError, match="src"):
        dk.scatter_blocks(cache, torch.tensor([1]), torch.zeros(1, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="block_dim"):
        dk.gather_blocks(cache, torch.tensor([1]), block_dim=2)


def test_dlpack_numpy_round_trip_in_place():
    cache = np.arange(30, dtype=np.float32).reshape(5, 6)
    got = dk.gather_blocks(cache, np.array([3, 1]))
    assert isinstance(got, np.ndarray) and np.array_equal(got, cache[[3, 1]])
    dk.scatter_blocks(cache, np.array([0]), np.full((1, 6), -1.0, dtype=np.float32))
    assert np.all(cache[0] == -1.0)
    kc = np.zeros((2, 2, 1, 2), dtype=np.float32)
    vc = np.zeros_like(kc)
    k = np.ones((1, 1, 2), dtype=np.float32)
    dk.write_kv(k, k, kc, vc, np.array([3], dtype=np.int64))
    assert np.all(kc[1, 1] == 1.0) and kc.sum() == 2.0
