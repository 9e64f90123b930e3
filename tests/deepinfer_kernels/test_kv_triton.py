"""Triton KV movement kernels (interpreter on CPU) against the reference loops."""

from __future__ import annotations

import torch
from _verify_cases import triton_device
from hypothesis import given, settings
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import (
    gather_blocks_reference,
    scatter_blocks_reference,
    write_kv_reference,
)

DEV = triton_device()


@settings(max_examples=6)
@given(
    num_blocks=st.integers(1, 5),
    block_size=st.sampled_from([1, 4, 16]),
    heads_dim=st.sampled_from([(1, 3), (2, 5), (3, 48)]),
    cache_dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_write_kv_kernel_matches_reference(num_blocks, block_size, heads_dim, cache_dtype, seed):
    heads, dim = heads_dim
    gen = torch.Generator().manual_seed(seed)
    total = num_blocks * block_size
    tokens = int(torch.randint(0, total + 1, (1,), generator=gen))
    slots = torch.randperm(total, generator=gen)[:tokens]
    slots = torch.where(torch.rand(tokens, generator=gen) < 0.25, -1, slots)
    k = torch.randn(tokens, heads, dim, generator=gen)
    v = torch.randn(tokens, heads, dim + 1, generator=gen)
    kc = torch.randn(num_blocks, block_size, heads, dim, generator=gen).to(cache_dtype)
    vc = torch.randn(num_blocks, block_size, heads, dim + 1, generator=gen).to(cache_dtype)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv_reference(k, v, kc_ref, vc_ref, slots)
    kc_d, vc_d = kc.to(DEV), vc.to(DEV)
    dk.write_kv(k.to(DEV), v.to(DEV), kc_d, vc_d, slots.to(DEV), use_triton=True)
    assert torch.equal(kc_d.cpu(), kc_ref) and torch.equal(vc_d.cpu(), vc_ref)


def test_write_kv_kernel_skips_out_of_range_unchecked():
    kc = torch.zeros(2, 2, 1, 3, device=DEV)
    vc = torch.zeros_like(kc)
    k = torch.ones(3, 1, 3, device=DEV)
    slots = torch.tensor([1, 4, -5], device=DEV)
    dk.write_kv(k, k, kc, vc, slots, use_triton=True, check_values=False)
    assert float(kc.sum()) == 3.0 and float(kc[0, 1].sum()) == 3.0


@settings(max_examples=6)
@given(
    shape_dim=st.sampled_from([((6, 4, 3), 0), ((2, 2, 5, 4, 3), 2), ((3, 7), 1), ((4, 2, 3), 2)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int8]),
    seed=st.integers(0, 2**16),
)
def test_gather_scatter_kernels_round_trip(shape_dim, dtype, seed):
    shape, block_dim = shape_dim
    gen = torch.Generator().manual_seed(seed)
    cache = (10 * torch.randn(shape, generator=gen)).to(dtype)
    nb = shape[block_dim]
    ids = torch.randperm(nb, generator=gen)[: max(1, nb - 1)]
    got = dk.gather_blocks(cache.to(DEV), ids.to(DEV), block_dim=block_dim, use_triton=True)
    want = gather_blocks_reference(cache, ids, block_dim)
    assert torch.equal(got.cpu(), want)
    target = torch.zeros_like(cache)
    scatter_blocks_reference(target, ids, want, block_dim)
    other = torch.zeros_like(cache).to(DEV)
    dk.scatter_blocks(other, ids.to(DEV), got, block_dim=block_dim, use_triton=True)
    assert torch.equal(other.cpu(), target)
