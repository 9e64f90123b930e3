"""The engine's block-key scheme and key material (``PrefixCacheConfig.key_hash``,
``model_id``, ``key_extra``) reach the store, and the routers of ``serve`` and ``pd`` hash
prompts with what the replicas' stores use, so a non-default scheme still routes a prompt to
the replica holding its prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deepinfer.cli import build_parser
from deepinfer.engine.cache_setup import PrefixCacheConfig, build_prefix_cache
from deepinfer.models.kv_pool import KVPool
from deepinfer.pd.routing import make_router, prompt_block_hashes
from deepinfer.pd.views import PDRequestView, WorkerView
from deepinfer.serve.replica import block_key
from deepinfer.serve.replica_view import ReplicaView
from deepinfer.serve.routing import ReplicaRouter, RoutedRequest, prompt_hashes
from deepinfer.serve.server import config_from_args
from deepinfer_cache import BlockStored, TieredKVStore, hash_token_blocks

BS = 4
PROMPT = list(range(100, 100 + 10 * BS))


def _store(**kw: object) -> TieredKVStore:
    pool = KVPool(2, 16, BS, 2, 8, dtype=torch.float32)
    config = PrefixCacheConfig(device_blocks=0, disk_bytes=0, host_bytes=1 << 20, **kw)  # type: ignore[arg-type]
    _, store = build_prefix_cache(pool, config, "model-a")
    return store


def _stored_keys(store: TieredKVStore, tokens: list[int]) -> list[int]:
    """What a replica publishes after storing ``tokens``: its store's own event hashes."""
    events = store.subscribe()
    shape = (len(tokens) // BS, *store.tiers[0].page_shape)
    assert store.store(tokens, torch.zeros(shape)) == len(tokens) // BS
    keys = [block_key(h) for e in events.poll() if isinstance(e, BlockStored) for h in e.hashes]
    assert len(keys) == len(tokens) // BS
    return keys


def test_config_validates_the_key_fields_naming_them() -> None:
    with pytest.raises(ValueError, match="key_hash"):
        PrefixCacheConfig(key_hash="sha1")
    with pytest.raises(ValueError, match="model_id"):
        PrefixCacheConfig(model_id="")
    with pytest.raises(TypeError, match="key_extra"):
        PrefixCacheConfig(key_extra=b"lora")  # type: ignore[arg-type]


def test_the_store_uses_the_configured_scheme_and_key_material() -> None:
    default = _store()
    # Without model_id / key_extra the key material is the derived identity, as before (old
    # caches keep hitting).
    assert default.key_hash == "xxh3_128" and default.model == b"model-a"
    custom = _store(key_hash="blake2b", model_id="llama-3-8b@abc", key_extra="lora:7")
    assert custom.key_hash == "blake2b"
    assert custom.hashes(PROMPT) == hash_token_blocks(
        PROMPT, BS, model=custom.model, key_hash="blake2b"
    )
    named = _store(model_id="llama-3-8b@abc")
    assert named.model == b"llama-3-8b@abc"
    # Each of scheme, identity and extra material changes every key.
    keyed = [
        set(s.hashes(PROMPT))
        for s in (
            default,
            custom,
            named,
            _store(key_extra="lora:7"),
            _store(key_extra="lora:8"),
            _store(key_hash="blake2b"),
        )
    ]
    for i, a in enumerate(keyed):
        for b in keyed[i + 1 :]:
            assert not a & b
    for s in (default, custom, named):
        s.close()


def _replica(index: int, store: TieredKVStore | None, held: list[int]) -> ReplicaView:
    v = ReplicaView(index)
    ready: dict[str, object] = {"block_size": BS, "capacity_blocks": 64, "max_batched_tokens": 64}
    if store is not None:  # what deepinfer.serve.replica sends in its "ready"
        ready.update(hash_model=store.model.hex(), key_hash=store.key_hash)
    v.on_ready(ready)
    v.on_state(
        {
            "num_waiting": 0,
            "waiting_tokens": 0,
            "num_running": 0,
            "kv_used_tokens": 0,
            "free_blocks": 64,
            "step_overhead_s": 0.01,
            "step_s_per_token": 0.001,
            "stored": held,
            "evicted": [],
        }
    )
    return v


@pytest.mark.parametrize("key_hash", ["blake2b", "xxh3_128"])
def test_serve_routes_a_non_default_scheme_to_the_replica_holding_the_prefix(
    key_hash: str,
) -> None:
    store = _store(key_hash=key_hash, key_extra="tenant-salt")
    held = _stored_keys(store, PROMPT)
    views = [_replica(0, store, []), _replica(1, store, held), _replica(2, store, held[:3])]
    view = views[0]
    assert view.key_hash == key_hash and view.hash_model == store.model
    hashes = prompt_hashes(PROMPT, BS, b"", view.hash_model, key_hash=view.key_hash)
    assert list(hashes) == held
    req = RoutedRequest(1, len(PROMPT), 4, hashes, "")
    for name in ("prefix_affinity", "cost"):
        assert ReplicaRouter(name, lambda: views).route(req, views) is views[1], name
    # Hashing with the default scheme and no key material (the routers before the replicas
    # published theirs) finds nothing the replicas hold.
    blind = prompt_hashes(PROMPT, BS, b"")
    assert all(v.cached_prefix_blocks(blind) == 0 for v in views)
    store.close()


def test_a_replica_without_a_cache_publishes_the_default_scheme() -> None:
    v = _replica(0, None, [])
    assert v.key_hash == "xxh3_128" and v.hash_model == b""


def test_pd_hashes_with_the_workers_published_scheme() -> None:
    store = _store(key_hash="blake2b", model_id="m", key_extra="x")
    held = _stored_keys(store, PROMPT)
    a, b = WorkerView(0, BS, 64, "prefill"), WorkerView(1, BS, 64, "prefill")
    for w in (a, b):  # as the coordinator's _mark_ready records each worker's "ready"
        w.hash_model, w.key_hash = store.model, store.key_hash
    b.remember(held)
    hashes = prompt_block_hashes(PROMPT, BS, b"", model=b.hash_model, key_hash=b.key_hash)
    assert list(hashes) == held
    assert (
        make_router("prefix_affinity").route(
            PDRequestView(1, len(PROMPT), 4, block_hashes=hashes), [a, b]
        )
        is b
    )
    assert b.cached_prefix_blocks(prompt_block_hashes(PROMPT, BS, b"")) == 0  # default: blind
    store.close()


def test_the_key_hash_flag_reaches_the_config(tmp_path: Path) -> None:
    parser = build_parser()
    cfg = config_from_args(
        parser.parse_args(["serve", "--cache-key-hash", "blake2b", "--in-process"])
    )
    assert cfg.prefix_cache is not None and cfg.prefix_cache.key_hash == "blake2b"
    default = config_from_args(parser.parse_args(["serve", "--in-process"]))
    assert default.prefix_cache is not None and default.prefix_cache.key_hash == "xxh3_128"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--cache-key-hash", "md5"])
