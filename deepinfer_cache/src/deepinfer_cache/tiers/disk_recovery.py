"""Opening a ``DiskTier``'s directory: make its layout, clear partial writes, quarantine
what is not a block file, and keep the header-checked blocks found for the store to re-index
(layer of ``DiskTier``; see ``disk_state.py``)."""

from __future__ import annotations

import os

from ..disk_format import CorruptBlockError, fsync_dir, read_header_file
from ..meta import RecoveredBlock
from .dir_hygiene import clear_tmp, ensure_dir
from .disk_state import DiskTierState


class DiskRecovery(DiskTierState):
    """Scan the directory on open; hand over the blocks found."""

    def _scan(self) -> None:
        for d in (self._blocks, self._tmp, self._quarantine):
            ensure_dir(d, self.counters)
        clear_tmp(self._tmp, self._quarantine, self.counters)
        for shard in range(256):
            ensure_dir(os.path.join(self._blocks, f"{shard:02x}"), self.counters)
        fsync_dir(self._blocks)
        shard_dirs = [os.path.join(self._blocks, f"{shard:02x}") for shard in range(256)]
        for sd in shard_dirs:
            with os.scandir(sd) as it:
                listed = list(it)
            entries = []
            for e in listed:
                # Only regular files can be blocks; links, directories, FIFOs... are moved to
                # quarantine without being opened (a FIFO would block, a link may loop).
                if e.is_file(follow_symlinks=False):
                    entries.append(e)
                else:
                    self._quarantine_odd(e.path, e.name)
            for e in entries:
                try:
                    h = read_header_file(e.path)
                    if h.key.hex() != e.name:
                        raise CorruptBlockError("file name does not match the block hash")
                    self._check_layout(h.dtype, h.shape, h.layout)
                except (CorruptBlockError, OSError):
                    self._quarantine_file(e.path, e.name)
                    continue
                self._files[h.key] = h.file_len
                self._used += h.file_len
                self._recovered.append(RecoveredBlock(h.key, h.meta, e.stat().st_mtime))

    def recovered(self) -> list[RecoveredBlock]:
        """Blocks found valid on open (header-checked), with the metadata to re-index them
        (empty after ``drop_recovered``)."""
        return list(self._recovered)

    def drop_recovered(self) -> None:
        """Free the recovered list once an index holds it (the store calls this after its
        rebuild): a million small objects kept for nothing would tax every GC pass."""
        self._recovered = []
