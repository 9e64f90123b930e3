"""KVPool layout and block allocator; AttentionMetadata construction."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import tiny_config

from deepinfer.models import AttentionMetadata, KVPool, OutOfBlocksError


def test_pool_layout_is_one_tensor_with_block_dim_2() -> None:
    cfg = tiny_config()
    pool = KVPool.for_model(cfg, num_blocks=5, block_size=4, dtype=torch.bfloat16)
    assert pool.tensor.shape == (cfg.num_layers, 2, 5, 4, cfg.num_kv_heads, cfg.head_dim)
    k = pool.k_cache(1)
    assert k.shape == (5, 4, cfg.num_kv_heads, cfg.head_dim)
    k[3, 2] = 1.0
    assert pool.tensor[1, 0, 3, 2].eq(1).all() and pool.tensor[1, 1].eq(0).all()
    assert pool.bytes_per_block == cfg.num_layers * 2 * 4 * cfg.kv_size * 2


@settings(max_examples=25)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["alloc", "share", "free"]), st.integers(0, 5)), max_size=40
    )
)
def test_allocator_matches_a_reference_count_model(ops: list[tuple[str, int]]) -> None:
    pool = KVPool(1, 8, 2, 1, 2)
    refs: dict[int, int] = {}
    for op, n in ops:
        held = sorted(refs)
        if op == "alloc":
            if n > 8 - len(refs):
                with pytest.raises(OutOfBlocksError):
                    pool.allocate(n)
                continue
            got = pool.allocate(n)
            assert len(set(got)) == n and not set(got) & set(refs)
            refs.update({b: 1 for b in got})
        elif held:
            block = held[n % len(held)]
            if op == "share":
                pool.share([block])
                refs[block] += 1
            else:
                pool.free([block])
                refs[block] -= 1
                if refs[block] == 0:
                    del refs[block]
        assert pool.num_free_blocks == 8 - len(refs)
        for b in range(8):
            assert pool.ref_count(b) == refs.get(b, 0)


@settings(max_examples=25, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 4)), max_size=60))
def test_allocator_reuses_freed_blocks_before_untouched_ones(ops: list[tuple[bool, int]]) -> None:
    """The pool's pages are committed on first write, so the blocks ever handed out must stay
    within the most blocks held at once (a FIFO free list walked the whole pool)."""
    pool = KVPool(1, 16, 2, 1, 2)
    held: list[int] = []
    peak = 0
    for alloc, n in ops:
        if alloc and n <= pool.num_free_blocks:
            held += pool.allocate(n)
        elif held:
            pool.free(held[-n:])
            del held[-n:]
        peak = max(peak, len(held))
        assert all(b < peak for b in held)


def test_allocator_hands_out_the_block_freed_last() -> None:
    pool = KVPool(1, 8, 2, 1, 2)
    assert pool.allocate(3) == [0, 1, 2]
    pool.free([1])
    assert pool.allocate(2) == [1, 3]


def test_allocator_errors() -> None:
    pool = KVPool(1, 4, 2, 1, 2)
    with pytest.raises(ValueError, match="already free"):
        pool.free([0])
    with pytest.raises(ValueError, match="outside"):
        pool.share([9])
    with pytest.raises(ValueError, match="cannot be shared"):
        pool.share([1])
    with pytest.raises(ValueError, match="n must be"):
        pool.allocate(-1)
    with pytest.raises(ValueError, match="block_size"):
        KVPool(1, 4, 0, 1, 2)


def test_attention_metadata_build_and_positions() -> None:
    attn = AttentionMetadata.build(
        [[3, 1], [0], [2, 5, 4]], seq_lens=[5, 1, 9], query_lens=[2, 1, 4], block_size=4
    )
    assert attn.block_table.tolist() == [[3, 1, 0], [0, 0, 0], [2, 5, 4]]
    assert attn.cu_seqlens_q.tolist() == [0, 2, 3, 7]
    assert attn.positions().tolist() == [3, 4, 0, 5, 6, 7, 8]
    # position 3 of seq 0 -> block 3 offset 3; position 4 -> block 1 offset 0; etc.
    assert attn.slot_mapping.tolist() == [15, 4, 0, 21, 22, 23, 16]
    assert attn.num_tokens == 7 and attn.batch_size == 3


def test_attention_metadata_validation() -> None:
    with pytest.raises(ValueError, match="query_lens"):
        AttentionMetadata.build([[0]], [2], [3], 4)
    with pytest.raises(ValueError, match="too few"):
        AttentionMetadata.build([[0]], [5], [1], 4)
    with pytest.raises(ValueError, match="slot_mapping"):
        AttentionMetadata(
            block_table=torch.zeros((1, 1), dtype=torch.int32),
            seq_lens=torch.ones(1, dtype=torch.int32),
            cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32),
            slot_mapping=torch.zeros(1, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="agree"):
        AttentionMetadata(
            block_table=torch.zeros((2, 1), dtype=torch.int32),
            seq_lens=torch.ones(1, dtype=torch.int32),
            cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32),
            slot_mapping=torch.zeros(1, dtype=torch.int64),
        )
