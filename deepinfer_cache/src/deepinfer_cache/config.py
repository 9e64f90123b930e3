"""`PrefixCacheConfig` and `build_store`: a tiered prefix store from one configuration.

What an engine (or any user of this package alone) needs to turn "how big is each tier, where
is the disk tier, how are blocks keyed" into a ready :class:`TieredKVStore`, as LMCache builds
its engine from one config object. Example::

    import tempfile
    import torch
    from deepinfer_cache import PrefixCacheConfig, build_store

    kv_dir = tempfile.mkdtemp()
    config = PrefixCacheConfig(device_blocks=0, host_bytes=64 << 20, directory=kv_dir)
    store = build_store(config, (2, 16, 4, 8), torch.bfloat16, 16, model_key="my-model")
    print([t.name for t in store.tiers])  # ['host', 'disk']
    store.close()

Tiers, fastest first: a device tier (``device_blocks`` pages: the caller's :class:`DeviceTier`
over a slice of its own KV pool, else a pool of its own), CPU memory (``host_bytes``), and a
disk directory (``disk_bytes``), so a restarted engine still hits.

The disk tier is `SegmentDiskTier` (the "segments" format: blocks in large segment files found
again through one manifest) unless ``disk_format`` is ``"files"`` (`DiskTier`, one file per
block, DeepInfer's engine default before deepinfer 0.11). A directory still in the "files"
format is converted in place on open with the default ``migrate_disk=True`` (crash-safe: the old
files go only once the segments holding them are durable; see `tiers.disk_formats`); with
``migrate_disk=False`` it is refused with an error naming the format and the
``deepinfer-cache migrate`` command. Nothing is silently ignored.

A disk directory has one writer at a time (a lock file). When the default directory is held by
another process, the store is built without a disk tier and warns; a directory named explicitly
in the config raises instead. A directory that cannot be created or written (read-only, full)
also leaves the store without a disk tier, with a warning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .cache_root import cache_root
from .hashing import DEFAULT_KEY_HASH, check_key_hash
from .lockfile import CacheLockedError
from .store import TieredKVStore
from .tiers import DISK_FORMATS, DeviceTier, DiskTier, HostTier, SegmentDiskTier

__all__ = ["PrefixCacheConfig", "build_store", "default_kv_directory"]


@dataclass(frozen=True)
class PrefixCacheConfig:
    """Sizes of the three tiers (0 leaves a tier out) and how blocks are keyed.

    ``device_blocks``: pages of the device tier (an engine takes them out of its KV pool).
    ``directory``: the disk tier's directory; ``None`` is :func:`default_kv_directory` of the
    model key. ``write_policy``: as in :class:`TieredKVStore`.

    ``disk_format``: ``"segments"`` (`SegmentDiskTier`, the default) or ``"files"``
    (`DiskTier`, one file per block). ``migrate_disk``: convert a directory still in the
    "files" format to "segments" on open (True) or refuse it (False).

    Block keys (see `deepinfer_cache.hashing`): ``key_hash`` is the scheme, ``"xxh3_128"``
    (default, fast, non-cryptographic) or ``"blake2b"`` (cryptographic: pick it where
    untrusted users share a namespace and a crafted collision matters). ``model_id`` is the
    model identity hashed into every key; by default it is the model key the store is built
    with (an engine derives one from the model path, the KV layout and dtype), so give one name
    (e.g. a weights fingerprint) to engines that must share KV across paths. ``key_extra`` is
    deployment-wide key material hashed in as well (an adapter id, a salt): stores with
    different ``key_extra`` never hit each other's blocks. The routers of DeepInfer's ``serve``
    and ``pd`` hash prompts with whatever the replicas' stores use."""

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


def default_kv_directory(model_key: str) -> Path:
    """``$DEEPINFER_CACHE_DIR/kv/<model_key>`` (default ``~/.cache/deepinfer/kv/<model_key>``)."""
    return cache_root() / "kv" / model_key


def build_store(
    config: PrefixCacheConfig,
    page_shape: Sequence[int],
    dtype: torch.dtype,
    block_size: int,
    *,
    model_key: str,
    device_tier: DeviceTier | None = None,
    device: torch.device | str = "cpu",
    directory_suffix: str = "",
) -> TieredKVStore:
    """The :class:`TieredKVStore` ``config`` describes, for pages of ``page_shape``/``dtype``
    holding ``block_size`` tokens each (close it on shutdown).

    ``model_key`` names the model whose KV the store holds: hashed into every block key (see
    :meth:`PrefixCacheConfig.key_material`), so two models sharing a directory never see each
    other's KV, and the default directory's name. ``device_tier``: the device tier to use when
    ``config.device_blocks`` is set (an engine passes one over its own KV pool); without it the
    tier allocates ``device_blocks`` pages of its own on ``device``. ``directory_suffix`` is
    appended to the disk directory's name (named or default): stores that share a
    configuration but must not share a directory (DeepInfer's PD prefill workers) each take
    their own sibling.
    """
    if not isinstance(model_key, str) or not model_key:
        raise ValueError(f"model_key must be a non-empty str, got {model_key!r}")
    page_shape = tuple(int(s) for s in page_shape)
    tiers: list[DeviceTier | HostTier | DiskTier | SegmentDiskTier] = []
    if config.device_blocks:
        if device_tier is None:
            page_bytes = torch.empty(page_shape, dtype=dtype, device="meta").nbytes
            device_tier = DeviceTier.allocate(
                page_shape, dtype, config.device_blocks * page_bytes, device=device
            )
        tiers.append(device_tier)
    if config.host_bytes:
        tiers.append(HostTier(page_shape, dtype, config.host_bytes))
    if config.disk_bytes:
        disk = _open_disk_tier(config, model_key, directory_suffix, page_shape, dtype)
        if disk is not None:
            tiers.append(disk)
    if not tiers:
        raise ValueError("config: the prefix cache needs at least one tier with capacity")
    return TieredKVStore(
        tiers,
        block_size,
        write_policy=config.write_policy,
        model=config.key_material(model_key),
        key_hash=config.key_hash,
    )


def _open_disk_tier(
    config: PrefixCacheConfig,
    model_key: str,
    directory_suffix: str,
    page_shape: tuple[int, ...],
    dtype: torch.dtype,
) -> DiskTier | SegmentDiskTier | None:
    """The disk tier, or ``None`` (with a warning) where the default directory is taken or
    any directory is unusable."""
    directory = Path(config.directory) if config.directory else default_kv_directory(model_key)
    directory = directory.with_name(directory.name + directory_suffix)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return _disk_tier(config, directory, page_shape, dtype)
    except CacheLockedError as exc:
        if config.directory:
            raise
        # Another engine on this machine owns the default directory; serving without the disk
        # tier beats refusing to start.
        warnings.warn(
            f"prefix cache: no disk tier for this engine ({exc}); pass "
            "PrefixCacheConfig(directory=...) to give it its own",
            RuntimeWarning,
            stacklevel=3,
        )
    except OSError as exc:
        # A read-only, full or otherwise unusable directory costs the restart hits, not the
        # service: run on the device and host tiers.
        warnings.warn(
            f"prefix cache: no disk tier, {os.fspath(directory)!r} is not usable ({exc})",
            RuntimeWarning,
            stacklevel=3,
        )
    return None


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
            stacklevel=4,
        )
    return tier
