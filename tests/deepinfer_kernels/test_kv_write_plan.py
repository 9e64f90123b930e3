"""``plan_write_kv`` + ``WriteKVPlan.run``: the same writes as ``write_kv`` for every layer of a
pool, with the slot checks done once; bad plans and mismatched caches raise naming the argument."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import deepinfer_kernels as dk
from deepinfer_kernels.reference import write_kv_reference


@given(
    tokens=st.integers(0, 12),
    skip=st.booleans(),
    layout=st.sampled_from(["pool_slab", "strided_blocks"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    slot_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
def test_plan_run_matches_reference_on_every_layer(  # type: ignore[no-untyped-def]
    tokens, skip, layout, dtype, slot_dtype, seed
):
    gen = torch.Generator().manual_seed(seed)
    layers, num_blocks, block_size = 3, 5, 4
    if layout == "pool_slab":
        pool = torch.randn(layers, 2, num_blocks, block_size, 2, 8, generator=gen).to(dtype)
        caches = [(pool[i, 0], pool[i, 1]) for i in range(layers)]
    else:
        # Every other block of a larger tensor: blocks and offsets do not merge into one dim.
        big = torch.randn(layers, 2, 2 * num_blocks, block_size, 2, 8, generator=gen).to(dtype)
        caches = [(big[i, 0, ::2], big[i, 1, ::2]) for i in range(layers)]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    if skip and tokens:
        slots[tokens // 2] = -1
    slots = slots.to(slot_dtype)
    plan = dk.plan_write_kv(slots, num_blocks=num_blocks, block_size=block_size)
    assert plan.num_tokens == tokens
    for kc, vc in caches:
        k = torch.randn(tokens, 2, 8, generator=gen)
        v = torch.randn(tokens, 2, 8, generator=gen)
        want_k, want_v = kc.clone(), vc.clone()
        write_kv_reference(k, v, want_k, want_v, slots.to(torch.int64))
        plan.run(k, v, kc, vc)
        assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


@pytest.mark.parametrize(
    ("slots", "message"),
    [
        ([0, 40], "slot_mapping: every entry must be -1 or lie in"),
        ([-2], "slot_mapping: every entry must be -1 or lie in"),
        ([3, 3], "slot_mapping: a slot appears twice"),
    ],
)
def test_bad_slot_values_are_rejected_at_plan_time(slots, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        dk.plan_write_kv(torch.tensor(slots), num_blocks=5, block_size=4)


def test_bad_plan_arguments() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        dk.plan_write_kv(torch.tensor([0]), num_blocks=0, block_size=4)
    with pytest.raises(ValueError, match="block_size"):
        dk.plan_write_kv(torch.tensor([0]), num_blocks=2, block_size=True)
    with pytest.raises(TypeError, match="slot_mapping"):
        dk.plan_write_kv(torch.tensor([0.0]), num_blocks=2, block_size=4)


def test_run_rejects_caches_and_rows_that_do_not_match_the_plan() -> None:
    plan = dk.plan_write_kv(torch.tensor([1, 6]), num_blocks=5, block_size=4)
    kc, vc = torch.zeros(5, 4, 2, 8), torch.zeros(5, 4, 2, 8)
    with pytest.raises(ValueError, match="k_cache/v_cache: expected leading dims"):
        plan.run(torch.zeros(2, 2, 8), torch.zeros(2, 2, 8), torch.zeros(6, 4, 2, 8), vc)
    with pytest.raises(ValueError, match="k/v: expected 2 rows"):
        plan.run(torch.zeros(3, 2, 8), torch.zeros(3, 2, 8), kc, vc)
    with pytest.raises(ValueError, match="k/v: expected trailing dims"):
        plan.run(torch.zeros(2, 2, 4), torch.zeros(2, 2, 8), kc, vc)
    assert not kc.any() and not vc.any()  # nothing was written by the failed calls
