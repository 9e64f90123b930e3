"""Issue #20: a block deleted while its record was between ``pwrite`` and the group commit
must not come back on reopen, even when nothing else changed before ``flush``/``close``.

The writer thread is held at the group commit (the test holds the tier's sync lock) so that
the delete lands exactly in that window; the race the random store test hit rarely is then
deterministic."""

from __future__ import annotations

import os
import threading
import time

from _segment_tier_helpers import fill, key, open_tier, page_of

from deepinfer_cache import BlockMeta
from deepinfer_cache.segment_format import RECORD_HEADER_BYTES, segment_name, slot_offset


def _wait_until(cond, what: str, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _delete_while_written(tier, k: bytes) -> tuple[str, int]:
    """Put ``k`` and delete it after its record is written but before it is committed;
    returns the record's (segment file, byte offset)."""
    sync_lock: threading.Lock = tier._sync_lock  # white box: hold the group commit
    with sync_lock:
        assert tier.put(k, page_of(9), BlockMeta(None, "chat", 4e9), block=True)
        _, _, sid, slot, _ = tier._pending[k]
        _wait_until(lambda: any(u[0] == k for u in tier._unsynced), "the record's pwrite")
        tier.delete(k)
    assert k not in tier
    path = os.path.join(tier.directory, "segments", segment_name(sid))
    return path, slot_offset(slot, tier.record_bytes)


def _header_at(path: str, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(RECORD_HEADER_BYTES)


def test_a_block_deleted_between_write_and_commit_stays_deleted_after_flush(tmp_path) -> None:
    tier = open_tier(tmp_path)
    fill(tier, [1, 2])  # a manifest covering the first slots; the next write is in the tail
    path, offset = _delete_while_written(tier, key(9))
    assert _header_at(path, offset) != bytes(RECORD_HEADER_BYTES)  # written, not committed
    assert tier.flush()
    # flush made the delete durable: the record's header is zeroed on disk already.
    assert _header_at(path, offset) == bytes(RECORD_HEADER_BYTES)
    tier.close()
    tier = open_tier(tmp_path)
    try:
        assert key(9) not in tier
        assert sorted(tier.keys()) == [key(1), key(2)]
        assert tier.get(key(9)) is None
    finally:
        tier.close()


def test_a_block_deleted_between_write_and_commit_stays_deleted_after_close(tmp_path) -> None:
    tier = open_tier(tmp_path)
    fill(tier, [1])
    _delete_while_written(tier, key(9))
    tier.close()  # no flush in between
    tier = open_tier(tmp_path)
    try:
        assert sorted(tier.keys()) == [key(1)]
    finally:
        tier.close()
