"""Build the engine's prefix cache from `deepinfer_cache` over the engine's own KV pool.

The device tier is a reserved slice of the engine's KV pool (cached pages stay where attention
can read them after a copy), the host tier is CPU memory (pinned on CUDA machines), and the disk
tier is a directory under the cache directory, so a restarted engine still hits. Pages move with
`deepinfer_kernels.gather_blocks` / `scatter_blocks`, plugged in at the cache's seam.

The disk tier is `SegmentDiskTier` (the "segments" format: blocks in large segment files found
again through one manifest) unless ``PrefixCacheConfig.disk_format`` is ``"files"`` (`DiskTier`,
one file per block, the engine's default before deepinfer 0.11). A directory still in the
"files" format is converted in place when the engine opens it with the default ``migrate_disk=True`` (crash-safe:
the old files go only once the segments holding them are durable; see
`deepinfer_cache.tiers.disk_formats`); with ``migrate_disk=False`` it is refused with an error
naming the format and the ``deepinfer-cache migrate`` command. Nothing is silently ignored.

A disk directory has one writer at a time (`deepinfer_cache` holds a lock file). When the
default directory is held by another running engine, this one starts without a disk tier and
warns; a directory named explicitly in `PrefixCacheConfig` raises instead. A directory that
cannot be created or written (read-only, full) also leaves the engine without a disk tier, with
a warning.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from deepinfer.engine.config import EngineConfig
from deepinfer.models.cache_files import cache_base
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer_cache import (
    DEFAULT_KEY_HASH,
    DISK_FORMATS,
    CacheLockedError,
    DeviceTier,
    DiskTier,
    HostTier,
    KVCacheAdapter,
    SegmentDiskTier,
    TieredKVStore,
    check_key_hash,
)
from deepinfer_kernels import gather_blocks, scatter_blocks


@dataclass(frozen=True)
class PrefixCacheConfig:
    """Sizes of the three tiers. ``device_blocks`` are taken out of the engine's pool.

    ``disk_format``: ``"segments"`` (`SegmentDiskTier`, the default) or ``"files"``
    (`DiskTier`, one file per block). ``migrate_disk``: convert a directory still in the
    "files" format to "segments" on open (True) or refuse it (False).

    Block keys (see `deepinfer_cache.hashing`): ``key_hash`` is the scheme, ``"xxh3_128"``
    (default, fast, non-cryptographic) or ``"blake2b"`` (cryptographic: pick it where
    untrusted users share a namespace and a crafted collision matters). ``model_id`` is the
    model identity hashed into every key; by default it is derived from the model path, the KV
    layout and dtype, so give one name (e.g. a weights fingerprint) to engines that must share
    KV across paths. ``key_extra`` is deployment-wide key material hashed in as well (an
    adapter id, a salt): engines with different ``key_extra`` never hit each other's blocks.
    The routers of ``serve`` and ``pd`` hash prompts with whatever the replicas' stores use
    (each replica publishes its scheme and key material when it is ready)."""

    device_blocks: int = 256
    host_bytes: int = 1 << 30
    disk_bytes: int = 8 << 30
    directory: str | None = None
    write_policy: str = "write-back"
    disk_format: str = "segments"
    migrate_disk: bool = True
    key_hash: str = DEFAULT_KEY_HASH
    model_id: str | None = None
    key_extra: str = ""

    def __post_init__(self) -> None:
        if self.device_blocks < 0:
            raise ValueError(f"device_blocks must be >= 0, got {self.device_blocks}")
        if self.host_bytes < 0 or self.disk_bytes < 0:
            raise ValueError("host_bytes and disk_bytes must be >= 0")
        if self.disk_format not in DISK_FORMATS:
            raise ValueError(
                f"disk_format must be one of {', '.join(DISK_FORMATS)}, got {self.disk_format!r}"
            )
        check_key_hash(self.key_hash)
        if self.model_id is not None and (not isinstance(self.model_id, str) or not self.model_id):
            raise ValueError(f"model_id must be a non-empty str or None, got {self.model_id!r}")
        if not isinstance(self.key_extra, str):
            raise TypeError(f"key_extra must be a str, got {type(self.key_extra).__name__}")

    def key_material(self, model_key: str) -> bytes:
        """The ``model`` bytes the store hashes into every block key: ``model_id`` (else
        ``model_key``, the derived identity) and, when set, ``key_extra``, length-prefixed so
        no two (identity, extra) pairs give the same bytes. Without ``key_extra`` it is the
        identity alone, so caches written before ``key_extra`` existed keep hitting."""
        identity = (self.model_id if self.model_id is not None else model_key).encode()
        if not self.key_extra:
            return identity
        extra = self.key_extra.encode()
        return len(identity).to_bytes(4, "little") + identity + extra


def default_kv_dir(model_key: str) -> Path:
    """``$DEEPINFER_CACHE_DIR/kv/<key>`` (default ``~/.cache/deepinfer/kv/<key>``)."""
    return cache_base() / "kv" / model_key


def model_cache_key(model_path: str, pool: KVPool) -> str:
    """Pages are only reusable by the same weights in the same layout and dtype."""
    shape = "x".join(str(s) for s in pool.tensor.select(2, 0).shape)
    raw = f"{model_path}|{shape}|{pool.tensor.dtype}|{pool.block_size}"
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def build_prefix_cache(
    pool: KVPool, config: PrefixCacheConfig, model_key: str, *, directory_suffix: str = ""
) -> tuple[KVCacheAdapter, TieredKVStore]:
    """A `KVCacheAdapter` over ``pool`` and the store behind it (close it on shutdown).

    ``directory_suffix`` is appended to the disk directory's name (named or default): engines
    that share a configuration but must not share a directory (PD prefill workers) each take
    their own sibling."""
    page_shape = tuple(pool.tensor.select(2, 0).shape)
    dtype = pool.tensor.dtype
    tiers: list[DeviceTier | HostTier | DiskTier | SegmentDiskTier] = []
    if config.device_blocks:
        reserved = pool.allocate(min(config.device_blocks, pool.num_blocks // 2))
        tiers.append(
            DeviceTier(
                pool.tensor,
                block_dim=2,
                block_ids=reserved,
                gather_fn=gather_blocks,
                scatter_fn=scatter_blocks,
            )
        )
    if config.host_bytes:
        tiers.append(HostTier(page_shape, dtype, config.host_bytes))
    if config.disk_bytes:
        directory = Path(config.directory) if config.directory else default_kv_dir(model_key)
        directory = directory.with_name(directory.name + directory_suffix)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tiers.append(_disk_tier(config, directory, page_shape, dtype))
        except CacheLockedError as exc:
            if config.directory:
                raise
            # Another engine on this machine owns the default directory; serving without the
            # disk tier beats refusing to start.
            warnings.warn(
                f"prefix cache: no disk tier for this engine ({exc}); pass "
                "PrefixCacheConfig(directory=...) to give it its own",
                RuntimeWarning,
                stacklevel=2,
            )
        except OSError as exc:
            # A read-only, full or otherwise unusable directory costs the restart hits, not
            # the service: run on the device and host tiers.
            warnings.warn(
                f"prefix cache: no disk tier, {os.fspath(directory)!r} is not usable ({exc})",
                RuntimeWarning,
                stacklevel=2,
            )
    if not tiers:
        raise ValueError("the prefix cache needs at least one tier with capacity")
    # The model identity goes into every block hash: two models sharing an explicit directory
    # never see each other's KV.
    store = TieredKVStore(
        tiers,
        pool.block_size,
        write_policy=config.write_policy,
        model=config.key_material(model_key),
        key_hash=config.key_hash,
    )
    adapter = KVCacheAdapter(
        store,
        pool.block_size,
        pool=pool.tensor,
        block_dim=2,
        gather_fn=gather_blocks,
        scatter_fn=scatter_blocks,
    )
    return adapter, store


def _disk_tier(
    config: PrefixCacheConfig, directory: Path, page_shape: tuple[int, ...], dtype: torch.dtype
) -> DiskTier | SegmentDiskTier:
    """The disk tier in the configured format (a directory in the other format raises
    ``CacheFormatError``, unless it is "files" and ``migrate_disk`` converts it)."""
    if config.disk_format == "files":
        return DiskTier(directory, page_shape, dtype, config.disk_bytes)
    tier = SegmentDiskTier(
        directory, page_shape, dtype, config.disk_bytes, migrate=config.migrate_disk
    )
    if tier.migration is not None:
        m = tier.migration
        warnings.warn(
            f"prefix cache: converted {os.fspath(directory)!r} to the 'segments' format "
            f"({m.blocks_copied} blocks copied, {m.corrupt_quarantined} damaged files "
            "quarantined)",
            RuntimeWarning,
            stacklevel=3,
        )
    return tier


def build_engine_kv(
    model: LlamaModel,
    engine: EngineConfig,
    cache: PrefixCacheConfig | None,
    model_path: str,
    *,
    directory_suffix: str = "",
) -> tuple[KVPool, KVCacheAdapter | None, TieredKVStore | None]:
    """The KV pool an engine over ``model`` runs on and, when ``cache`` is given, the prefix
    cache over that pool (keyed by ``model_path``; ``directory_suffix`` as in
    :func:`build_prefix_cache`); pass both to `LLMEngine`."""
    pool = KVPool.for_weights(model, engine.num_blocks, engine.block_size)
    if cache is None:
        return pool, None, None
    adapter, store = build_prefix_cache(
        pool, cache, model_cache_key(model_path, pool), directory_suffix=directory_suffix
    )
    return pool, adapter, store
