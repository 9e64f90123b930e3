"""Telling the two on-disk formats apart, and converting "files" into "segments" in place.

``DiskTier`` writes the "files" format (``blocks/ab/<hash>``: one file per block);
``SegmentDiskTier`` writes the "segments" format (``segments/*.seg`` plus ``manifest``). Each
tier refuses a directory holding the other's blocks with :class:`CacheFormatError` (naming the
format found and what to do), so no upgrade silently ignores, shadows or deletes a cache.

:func:`migrate_files_to_segments` converts in place and is crash-safe at every step:

1. every block file is read and checked in full (both checksums, its name against its key,
   its geometry against the tier's); one that fails is moved to ``quarantine/`` and counted,
   never copied and never deleted;
2. the good blocks are written into segments, a chain's blocks in consecutive slots (parents
   first), and ``flush()`` makes them durable and writes a manifest listing them;
3. only then are the old files removed (then the empty shard directories).

A crash before 3 leaves every old file in place (and maybe some segments): the directory is
still refused by a plain open, and running the migration again copies what is missing and
finishes. A crash during 3 leaves blocks that are in both formats; the rerun finds them in the
segments already and removes their files.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..disk_format import CorruptBlockError, fsync_dir, read_block_file, read_header_file
from ..meta import BlockMeta
from .dir_hygiene import move_aside

if TYPE_CHECKING:
    from .segment_disk import SegmentDiskTier

FILES = "files"
SEGMENTS = "segments"
DISK_FORMATS = (SEGMENTS, FILES)


class CacheFormatError(RuntimeError):
    """A cache directory holds blocks in the other on-disk format than the tier opening it."""


def _block_entries(directory: str) -> list[os.DirEntry[str]]:
    """Every entry under ``blocks/<shard>/`` (block files and strangers alike)."""
    blocks = os.path.join(directory, "blocks")
    out: list[os.DirEntry[str]] = []
    try:
        with os.scandir(blocks) as it:
            shards = [e for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return out
    for shard in shards:
        with os.scandir(shard.path) as it:
            out.extend(it)
    return out


def holds_files_format(directory: str) -> bool:
    """True when ``directory`` holds at least one entry of the "files" format (the empty shard
    directories a ``DiskTier`` leaves behind hold no data and do not count)."""
    return bool(_block_entries(directory))


def holds_segments_format(directory: str) -> bool:
    """True when ``directory`` holds a manifest or any segment file."""
    if os.path.lexists(os.path.join(directory, "manifest")):
        return True
    try:
        with os.scandir(os.path.join(directory, "segments")) as it:
            return any(e.name.endswith(".seg") for e in it)
    except (FileNotFoundError, NotADirectoryError):
        return False


def files_format_refused(directory: str) -> CacheFormatError:
    return CacheFormatError(
        f"{directory!r} holds a prefix cache in the 'files' format (one file per block, "
        "written by DiskTier); SegmentDiskTier reads the 'segments' format. Convert it in "
        f"place with `deepinfer-cache migrate {directory}` (or open it with "
        "SegmentDiskTier(..., migrate=True)), or keep the old format with DiskTier "
        "(engine: PrefixCacheConfig(disk_format='files'), CLI: --cache-disk-format files)"
    )


def segments_format_refused(directory: str) -> CacheFormatError:
    return CacheFormatError(
        f"{directory!r} holds a prefix cache in the 'segments' format (written by "
        "SegmentDiskTier); DiskTier reads the 'files' format. Open it with SegmentDiskTier "
        "(engine: PrefixCacheConfig(disk_format='segments'), the default)"
    )


def files_format_geometry(directory: str) -> tuple[torch.dtype, tuple[int, ...], str] | None:
    """(dtype, page shape, layout) of the first readable block file (what the CLI opens the
    segment tier with); None when there is none."""
    for e in _block_entries(directory):
        if not e.is_file(follow_symlinks=False):
            continue
        with contextlib.suppress(CorruptBlockError, OSError):
            h = read_header_file(e.path)
            return h.dtype, h.shape, h.layout
    return None


@dataclass
class MigrationReport:
    """What :func:`migrate_files_to_segments` did."""

    blocks_copied: int = 0
    already_in_segments: int = 0  # copied by an earlier, interrupted run
    corrupt_quarantined: int = 0  # failed a check: moved to quarantine/, not copied
    odd_entries_quarantined: int = 0  # not a regular file (links, FIFOs, directories)
    files_removed: int = 0
    bytes_copied: int = 0


def migrate_files_to_segments(tier: SegmentDiskTier) -> MigrationReport:
    """Move every block of the "files" format in ``tier.directory`` into ``tier`` (open, and
    holding the directory lock); see the module docstring for the order that keeps it safe.
    Raises ``OSError`` (old files kept) when a copy cannot be made durable."""
    rep = MigrationReport()
    quarantine = os.path.join(tier.directory, "quarantine")
    headers: dict[bytes, tuple[str, BlockMeta]] = {}
    for e in _block_entries(tier.directory):
        if not e.is_file(follow_symlinks=False):
            rep.odd_entries_quarantined += 1
            move_aside(quarantine, e.path, f"{e.name}.odd")
            continue
        try:
            h = read_header_file(e.path)
            if h.key.hex() != e.name:
                raise CorruptBlockError("file name does not match the block hash")
            if (h.dtype, h.shape, h.layout) != (tier.dtype, tier.page_shape, tier.layout):
                raise CorruptBlockError("block geometry is not the tier's")
            # A block file's mtime holds its latest expiry (DiskTier.touch).
            expires = max(h.meta.expires_at, e.stat(follow_symlinks=False).st_mtime)
        except (CorruptBlockError, OSError):
            rep.corrupt_quarantined += 1
            move_aside(quarantine, e.path, e.name)
            continue
        m = h.meta
        headers[h.key] = (e.path, BlockMeta(m.parent, m.retention, expires, m.tenant))
    # Every block is kept, even past capacity_bytes (a segment slot can be a little larger
    # than a block file): the store evicts the least recently used down to the capacity
    # before its next write to this tier, as after any restart with a smaller capacity.
    need = tier.used_bytes() + sum(k not in tier for k in headers) * tier.record_bytes
    capacity, tier.capacity_bytes = tier.capacity_bytes, max(tier.capacity_bytes, need)
    try:
        _copy(tier, headers, rep, quarantine)
    finally:
        tier.capacity_bytes = capacity
    # The manifest listing every block is durable: the old files can go.
    for path, _ in headers.values():
        rep.files_removed += _remove_file(path)
    _remove_empty_blocks_dir(tier.directory)
    return rep


def _copy(
    tier: SegmentDiskTier,
    headers: dict[bytes, tuple[str, BlockMeta]],
    rep: MigrationReport,
    quarantine: str,
) -> None:
    """Copy the blocks (checked in full) and make them durable with a manifest."""
    copied: list[bytes] = []
    for key in _parents_first(headers):
        path, meta = headers[key]
        if key in tier:
            rep.already_in_segments += 1
            continue
        try:
            h, page = read_block_file(path)  # both checksums
            if h.key != key:
                raise CorruptBlockError("block hash in header does not match")
        except (CorruptBlockError, OSError):
            rep.corrupt_quarantined += 1
            move_aside(quarantine, path, key.hex())
            del headers[key]
            continue
        if not tier.put(key, page, meta, block=True):
            raise OSError(f"migration: the segment tier refused block {key.hex()}")
        copied.append(key)
        rep.bytes_copied += page.numel() * page.element_size()
    if not tier.flush():
        raise OSError("migration: the copies could not be made durable; old files kept")
    lost = tier.pop_failed()
    if lost or not all(tier.is_durable(k) for k in headers):
        raise OSError(f"migration: {len(lost)} blocks failed to write; old files kept")
    rep.blocks_copied = len(copied)


def _parents_first(headers: dict[bytes, tuple[str, BlockMeta]]) -> list[bytes]:
    """Keys ordered chain by chain, each parent before its children (depth-first), so a
    prompt's blocks land in consecutive slots and are read back with few large reads."""
    children: dict[bytes | None, list[bytes]] = defaultdict(list)
    for k, (_, m) in headers.items():
        children[m.parent if m.parent in headers else None].append(k)
    out: list[bytes] = []
    stack = list(reversed(children[None]))
    while stack:
        k = stack.pop()
        out.append(k)
        stack.extend(reversed(children.get(k, ())))
    seen = set(out)
    out.extend(k for k in headers if k not in seen)  # a parent cycle (damage): still copied
    return out


def _remove_file(path: str) -> int:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return 1


def _remove_empty_blocks_dir(directory: str) -> None:
    blocks = os.path.join(directory, "blocks")
    with contextlib.suppress(OSError):
        for name in os.listdir(blocks):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(blocks, name))  # only empty shards go
        os.rmdir(blocks)
    with contextlib.suppress(OSError):
        fsync_dir(directory)
