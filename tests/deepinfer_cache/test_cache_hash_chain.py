"""``BlockHashChain`` (#20, the engine-side hash cache): a sequence's block hashes, each block
hashed once, equal to the store's own keys; the store refuses a chain made for other keys."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from deepinfer_cache import (
    KEY_HASHES,
    BlockHashChain,
    DeviceTier,
    HostTier,
    TieredKVStore,
    hash_token_blocks,
)
from deepinfer_cache.block_hash_chain import present_prefix

BS = 4


def _store(**kw: object) -> TieredKVStore:
    return TieredKVStore([HostTier((2,), torch.float32, 1 << 16)], block_size=BS, **kw)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), max_size=120),
    cuts=st.lists(st.integers(0, 120), max_size=6),
    ns=st.binary(max_size=6),
    model=st.binary(max_size=6),
    extra=st.binary(max_size=6),
    key_hash=st.sampled_from(KEY_HASHES),
    bs=st.sampled_from([1, 3, 8]),
)
def test_chain_grown_in_steps_equals_hashing_everything(
    tokens: list[int],
    cuts: list[int],
    ns: bytes,
    model: bytes,
    extra: bytes,
    key_hash: str,
    bs: int,
) -> None:
    chain = BlockHashChain(bs, ns, model=model, extra=extra, key_hash=key_hash)
    for cut in [*sorted(cuts), len(tokens)]:
        part = tokens[:cut]
        assert chain.hashes_for(part) == hash_token_blocks(
            part, bs, ns, model=model, extra=extra, key_hash=key_hash
        )
    # Every block was hashed exactly once however the tokens arrived.
    assert chain.blocks_hashed == len(tokens) // bs
    # A shorter prefix is read from the chain, not hashed again.
    assert chain.hashes_for(tokens[: bs * 2]) == chain.hashes[:2] or len(tokens) < 2 * bs
    assert chain.blocks_hashed == len(tokens) // bs


def test_truncate_then_other_tokens() -> None:
    chain = BlockHashChain(BS)
    chain.update(list(range(12)))
    chain.truncate(5)  # blocks past token 5 are forgotten: one full block stays
    assert len(chain.hashes) == 1
    other = list(range(4)) + [99] * 8
    assert chain.hashes_for(other) == hash_token_blocks(other, BS)
    with pytest.raises(ValueError, match="num_tokens"):
        chain.truncate(-1)


@settings(max_examples=25, deadline=None)
@given(
    stored=st.lists(st.integers(0, 50), min_size=0, max_size=40),
    probe_tail=st.lists(st.integers(0, 50), max_size=20),
    keep=st.integers(0, 40),
)
def test_store_calls_with_a_chain_equal_calls_without(
    stored: list[int], probe_tail: list[int], keep: int
) -> None:
    store = _store(model=b"m")
    n = len(stored) // BS
    store.store(stored, torch.arange(n * 2, dtype=torch.float32).reshape(n, 2), namespace=b"t")
    probe = stored[:keep] + probe_tail
    chain = store.hash_chain(b"t")
    with_chain = store.lookup(probe, b"t", block_hashes=chain)
    plain = store.lookup(probe, b"t")
    assert with_chain.num_blocks == plain.num_blocks
    assert with_chain.hashes[: with_chain.num_blocks] == plain.hashes[: plain.num_blocks]
    got = store.fetch(probe, b"t", block_hashes=chain).result()
    want = store.fetch(probe, b"t").result()
    assert got.num_blocks == want.num_blocks
    for a, b in zip(got.pages, want.pages):
        assert torch.equal(a, b)
    assert chain.hashes == store.hashes(probe, b"t")
    assert chain.blocks_hashed == len(probe) // BS  # lookup and fetch shared the hashes


def test_store_with_a_chain_stores_the_same_keys() -> None:
    a, b = _store(), _store()
    toks = list(range(21))
    chain = a.hash_chain()
    assert a.store(toks, torch.ones(5, 2), block_hashes=chain) == 5
    assert b.store(toks, torch.ones(5, 2)) == 5
    assert a.index.keys_parents_first() == b.index.keys_parents_first() == a.hashes(toks)


def test_lease_device_with_a_chain() -> None:
    pool = torch.zeros(8, 2)
    store = TieredKVStore([DeviceTier(pool, block_dim=0)], block_size=BS)
    toks = list(range(12))
    store.store(toks, torch.ones(3, 2))
    ids, hashes = store.lease_device(toks, block_hashes=store.hash_chain())
    assert len(ids) == 3 and hashes == store.hashes(toks)
    store.release(hashes)


def test_a_chain_for_other_keys_is_refused() -> None:
    store = _store(model=b"m")
    toks = list(range(8))
    for chain in (
        store.hash_chain(b"other-tenant"),
        BlockHashChain(BS),  # no model identity
        BlockHashChain(BS, model=b"m", key_hash="blake2b"),
        BlockHashChain(BS * 2, model=b"m"),
        store.hash_chain(extra=b"lora-1"),
    ):
        with pytest.raises(ValueError, match="block_hashes was made for another"):
            store.lookup(toks, block_hashes=chain)
    with pytest.raises(ValueError, match="block_extras"):
        store.lookup(toks, block_hashes=store.hash_chain(), block_extras={0: b"img"})
    with pytest.raises(TypeError, match="BlockHashChain"):
        store.lookup(toks, block_hashes=[b"x" * 16])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size"):
        BlockHashChain(0)


def test_present_prefix_probes_logarithmically() -> None:
    hashes = [i.to_bytes(16, "little") for i in range(1000)]

    class Probed(set):  # type: ignore[type-arg]
        probes = 0

        def __contains__(self, key: object) -> bool:
            Probed.probes += 1
            return super().__contains__(key)

    for k in (0, 1, 500, 999, 1000):
        Probed.probes = 0
        assert present_prefix(Probed(hashes[:k]), hashes) == k
        assert Probed.probes <= 12
    assert present_prefix(set(), []) == 0
