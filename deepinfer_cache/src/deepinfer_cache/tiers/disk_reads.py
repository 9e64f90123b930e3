"""Reading a ``DiskTier``'s blocks: a page still being written is served from memory, a file
is read and checked, and a corrupt or vanished one is quarantined and reported as lost
(layer of ``DiskTier``; see ``disk_state.py``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future

import torch

from ..disk_format import CorruptBlockError, read_block_file
from .disk_state import DiskTierState


class DiskReads(DiskTierState):
    """Read blocks, on the caller's thread or the reader threads."""

    def get(self, key: bytes) -> torch.Tensor | None:
        with self._lock:
            pend = self._pending.get(key)
            if pend is not None:
                return pend[1].clone()
            if key not in self._files:
                return None
        path = self.path_of(key)
        t0 = time.perf_counter()
        try:
            header, page = read_block_file(path)
            if header.key != key:
                raise CorruptBlockError("block hash in header does not match")
            self._check_layout(header.dtype, header.shape, header.layout)
        except FileNotFoundError:
            with self._lock:
                self._forget(key)
            self._failed.append(key)
            return None
        except (CorruptBlockError, OSError):
            with self._lock:
                if key in self._files:
                    self._forget(key)
                    self._quarantine_file(path, key.hex())
            self._failed.append(key)
            return None
        with self._lock:
            self.counters.bytes_read += header.file_len
            self.counters.blocks_read += 1
            self.counters.read_seconds += time.perf_counter() - t0
        return page

    def get_async(self, key: bytes) -> Future[torch.Tensor | None]:
        """``get`` on a reader thread, so many blocks are read (and checksummed) in parallel."""
        return self._readers.submit(self.get, key)

    def get_many(self, keys: Sequence[bytes]) -> list[torch.Tensor | None]:
        """Read ``keys`` in parallel; entry i is None when block i is missing or corrupt."""
        futs = [self.get_async(k) for k in keys]
        return [f.result() for f in futs]

    def pop_failed(self) -> list[bytes]:
        """Blocks lost since the last call (write error, corrupt or vanished file)."""
        out: list[bytes] = []
        while self._failed:
            out.append(self._failed.popleft())
        return out
