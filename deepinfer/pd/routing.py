"""How the PD coordinator routes: router construction, prompt block hashes for the prefill
workers' cache view, and each prefill worker's cache settings."""

from __future__ import annotations

import dataclasses
from typing import Any

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer_cache import DEFAULT_KEY_HASH, hash_token_blocks
from deepinfer_sched.policies import (
    LeastLoadedRouter,
    PowerOfTwoRouter,
    PrefixAffinityRouter,
    RoundRobinRouter,
)
from deepinfer_sched.policies.base import Router


def make_router(name: str) -> Router:
    """The ``deepinfer_sched`` router named in ``PDConfig.router`` (validated there)."""
    if name == "round_robin":
        return RoundRobinRouter()
    if name == "power_of_two":
        return PowerOfTwoRouter(seed=0)
    if name == "prefix_affinity":
        return PrefixAffinityRouter()
    return LeastLoadedRouter()


def prompt_block_hashes(
    prompt_ids: list[int],
    block_size: int,
    namespace: bytes,
    *,
    model: bytes = b"",
    key_hash: str = DEFAULT_KEY_HASH,
) -> tuple[int, ...]:
    """The prompt's chained block hashes as the prefill workers' caches compute them (``model``
    and ``key_hash``: the key material and scheme a worker publishes in its ``ready``),
    shortened to 64-bit ints for the routers; ``()`` for a prompt the workers will reject
    anyway."""
    try:
        hashes = hash_token_blocks(
            prompt_ids, block_size, namespace, model=model, key_hash=key_hash
        )
    except (TypeError, ValueError, OverflowError):
        return ()
    return tuple(int.from_bytes(h[:8], "big") for h in hashes)


def worker_cache_fields(cache: PrefixCacheConfig, index: int) -> dict[str, Any]:
    """Prefill worker ``index``'s cache settings: the shared tiers plus a directory suffix, so
    its disk tier is a sibling of the named (or default) directory, ``...-pd-prefill-<i>``:
    never inside another tier's directory, and never shared by two writers."""
    return {**dataclasses.asdict(cache), "directory_suffix": f"-pd-prefill-{index}"}
