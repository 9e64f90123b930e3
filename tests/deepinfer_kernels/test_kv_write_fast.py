"""``write_kv``'s CPU fast path (one ``index_copy_`` on the flattened cache) against the
reference, on the layouts an engine uses: a layer's slab of a pool, all slots valid or some
skipped, unchecked calls with out-of-range slots, caches whose block dims do not merge."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import write_kv_reference


@given(
    tokens=st.integers(1, 12),
    skip=st.sampled_from(["none", "minus_one", "out_of_range"]),
    layout=st.sampled_from(["pool_slab", "strided_blocks"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_write_kv_fast_path_matches_reference(tokens, skip, layout, dtype, seed):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    num_blocks, block_size = 5, 4
    if layout == "pool_slab":
        # [layers, 2, blocks, block_size, heads, dim]: layer 1's K and V are dense slabs.
        pool = torch.randn(3, 2, num_blocks, block_size, 2, 8, generator=gen).to(dtype)
        kc, vc = pool[1, 0], pool[1, 1]
        before = pool.clone()
    else:
        # Every other block of a larger tensor: blocks and offsets do not merge into one dim.
        big = torch.randn(2, 2 * num_blocks, block_size, 2, 8, generator=gen).to(dtype)
        kc, vc = big[0, ::2], big[1, ::2]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    if skip == "minus_one":
        slots[0] = -1
    elif skip == "out_of_range":
        slots[-1] = num_blocks * block_size + 3
    k = torch.randn(tokens, 2, 8, generator=gen)
    v = torch.randn(tokens, 2, 8, generator=gen)
    expected_k, expected_v = kc.clone(), vc.clone()
    ref_slots = torch.where(slots < num_blocks * block_size, slots, -1)
    write_kv_reference(k, v, expected_k, expected_v, ref_slots)
    dk.write_kv(k, v, kc, vc, slots, check_values=skip != "out_of_range")
    assert torch.equal(kc, expected_k) and torch.equal(vc, expected_v)
    if layout == "pool_slab":
        # The neighbouring layers of the pool are left alone.
        assert torch.equal(pool[0], before[0]) and torch.equal(pool[2], before[2])
