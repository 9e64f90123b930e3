"""SegmentDiskTier: segment files + manifest. Round trips, reopen from the manifest alone, the
tail written after the last manifest, damage of every kind (a miss, never a wrong block),
torn tails, compaction, coalesced reads, and random byte flips (hypothesis)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from deepinfer_cache import BlockMeta, CacheLockedError, SegmentDiskTier
from deepinfer_cache.segment_format import RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES

PAGE = (2, 3, 4)
SLOTS_PER_SEGMENT = 4


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def page_of(i: int) -> torch.Tensor:
    return (torch.arange(24, dtype=torch.float32).reshape(PAGE) + 1000.0 * i).to(torch.bfloat16)


def meta(i: int) -> BlockMeta:
    return BlockMeta(key(i - 1) if i else None, "agent" if i % 2 else "chat", 2e9 + i)


def open_tier(path, **kw) -> SegmentDiskTier:
    kw.setdefault("capacity_bytes", 1 << 24)
    kw.setdefault("segment_bytes", SLOTS_PER_SEGMENT * 4096)
    return SegmentDiskTier(path, PAGE, torch.bfloat16, **kw)


def fill(tier: SegmentDiskTier, ids) -> None:
    for i in ids:
        assert tier.put(key(i), page_of(i), meta(i), block=True)


def served_is_right(tier: SegmentDiskTier, ids) -> list[int]:
    """Ids whose page is served; every served page must be exactly the one stored."""
    found = []
    for i, page in zip(ids, tier.get_many([key(i) for i in ids])):
        if page is not None:
            assert torch.equal(page, page_of(i)), f"block {i} served wrong bytes"
            found.append(i)
    return found


def snapshot(src: Path) -> Path:
    """Copy an open tier's files: what a crash at this moment would leave behind."""
    dst = Path(tempfile.mkdtemp(dir=src.parent, prefix="crash-")) / "cache"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def test_round_trip_reopen_reads_only_the_manifest(tmp_path) -> None:
    tier = open_tier(tmp_path)
    fill(tier, range(10))
    assert tier.flush()
    assert served_is_right(tier, range(10)) == list(range(10))
    tier.close()
    assert len(os.listdir(tmp_path / "segments")) == 3  # 4 slots per segment
    tier = open_tier(tmp_path)
    assert tier.counters.tail_records_scanned == 0  # everything came from the manifest
    rec = {b.key: b.meta for b in tier.recovered()}
    assert rec == {key(i): meta(i) for i in range(10)}
    assert served_is_right(tier, range(10)) == list(range(10))
    assert tier.used_bytes() == 10 * tier.record_bytes
    tier.close()


def test_records_after_the_last_manifest_are_found_by_the_tail_scan(tmp_path) -> None:
    tier = open_tier(tmp_path)
    fill(tier, range(5))
    assert tier.flush()
    fill(tier, range(5, 11))
    tier._workers.drain()  # written and fsynced, no new manifest yet
    tier._sync()
    crash = snapshot(tmp_path)
    tier.close()
    tier = open_tier(crash)
    assert tier.counters.tail_records_scanned >= 6
    assert served_is_right(tier, range(11)) == list(range(11))
    tier.close()
    tier = open_tier(crash)  # the open wrote a manifest covering the tail
    assert tier.counters.tail_records_scanned == 0 and len(tier) == 11
    tier.close()


def test_torn_tail_record_is_skipped_and_counted(tmp_path) -> None:
    tier = open_tier(tmp_path)
    fill(tier, range(3))
    assert tier.flush()
    fill(tier, range(3, 6))
    tier._workers.drain()
    tier._sync()
    path, off = tier.location_of(key(5))
    crash = snapshot(tmp_path)
    tier.close()
    seg = crash / "segments" / os.path.basename(path)
    os.truncate(seg, off + RECORD_HEADER_BYTES + 10)  # header landed, payload cut short
    tier = open_tier(crash)
    assert tier.counters.torn_records == 1 and tier.counters.corrupt_quarantined == 0
    assert served_is_right(tier, range(6)) == list(range(5))
    tier.close()


def _damage(tier_dir: Path, path: str, off: int, kind: str) -> None:
    seg = tier_dir / "segments" / os.path.basename(path)
    if kind == "payload":
        _flip(seg, off + RECORD_HEADER_BYTES + 5)
    elif kind == "record-header":
        _flip(seg, off + 20)
    elif kind == "truncate":
        os.truncate(seg, off + 100)
    elif kind == "segment-header":
        _flip(seg, 12)
    elif kind == "segment-deleted":
        os.unlink(seg)
    elif kind == "manifest-flip":
        _flip(tier_dir / "manifest", os.path.getsize(tier_dir / "manifest") - 7)
    elif kind == "manifest-truncated":
        os.truncate(tier_dir / "manifest", 100)
    elif kind == "manifest-deleted":
        os.unlink(tier_dir / "manifest")
    elif kind == "manifest-garbage":
        (tier_dir / "manifest").write_bytes(os.urandom(3000))
    elif kind == "manifest-is-a-directory":
        os.unlink(tier_dir / "manifest")
        os.mkdir(tier_dir / "manifest")
    elif kind == "stray-files":
        (tier_dir / "segments" / "README").write_text("not a segment")
        os.symlink("/dev/zero", tier_dir / "segments" / "00000000000000ff.seg")
        os.mkfifo(tier_dir / "segments" / "00000000000000fe.seg")
    else:
        raise AssertionError(kind)


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


DAMAGE = [
    "payload",
    "record-header",
    "truncate",
    "segment-header",
    "segment-deleted",
    "manifest-flip",
    "manifest-truncated",
    "manifest-deleted",
    "manifest-garbage",
    "manifest-is-a-directory",
    "stray-files",
]


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_is_a_miss_never_a_wrong_block(tmp_path, kind: str) -> None:
    tier = open_tier(tmp_path)
    fill(tier, range(10))
    assert tier.flush()
    path, off = tier.location_of(key(5))  # slot 1 of the second segment
    tier.close()
    _damage(tmp_path, path, off, kind)
    tier = open_tier(tmp_path)
    found = served_is_right(tier, range(10))
    c = tier.counters
    if kind.startswith("manifest"):
        assert found == list(range(10)) and c.tail_records_scanned == 10  # rescanned
        assert c.manifest_rejected == (kind != "manifest-deleted")
    elif kind == "stray-files":
        assert found == list(range(10)) and c.odd_entries_quarantined == 3
    elif kind in ("payload", "record-header"):
        assert found == [i for i in range(10) if i != 5] and c.corrupt_quarantined == 1
        assert len(tier) == 9  # forgotten once seen
    elif kind == "truncate":
        assert found == [0, 1, 2, 3, 4, 8, 9]  # slot 1 cut mid-record, slots 1-3 gone
    else:  # the whole second segment
        assert found == [0, 1, 2, 3, 8, 9]
    tier.close()
    # A second reopen agrees (no damaged record came back through the manifest).
    tier = open_tier(tmp_path)
    assert served_is_right(tier, range(10)) == found
    tier.close()


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    flips=st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 0.9999)), min_size=1, max_size=6),
    flushed=st.integers(0, 12),
)
def test_random_byte_flips_never_serve_a_wrong_block(tmp_path_factory, flips, flushed) -> None:
    d = tmp_path_factory.mktemp("seg")
    tier = open_tier(d)
    fill(tier, range(flushed))
    assert tier.flush()
    fill(tier, range(flushed, 12))
    tier._workers.drain()
    tier._sync()
    crash = snapshot(d)
    tier.close()
    files = [*sorted(crash.glob("segments/*.seg")), crash / "manifest"]
    for which, where in flips:
        f = files[which % len(files)]
        size = os.path.getsize(f)
        if size:
            _flip(f, int(where * size))
    tier = open_tier(crash)
    served_is_right(tier, range(12))
    tier.close()


def test_deleted_blocks_do_not_come_back_and_segments_are_compacted(tmp_path) -> None:
    tier = open_tier(tmp_path, compact_below=0.5)
    fill(tier, range(12))  # three segments of four
    assert tier.flush()
    first_seg = tier.location_of(key(0))[0]
    for i in (0, 1, 2, 4, 5):  # first segment: 1 of 4 live; second: 2 of 4 live
        tier.delete(key(i))
    assert tier.flush()  # the writer threads compact after deletes; compact() finishes it
    tier.compact()
    c = tier.counters
    assert c.records_compacted == 3 and c.segments_retired == 2  # keys 3, 6 and 7 moved
    assert not os.path.exists(first_seg) and tier.disk_bytes() < 12 * tier.record_bytes
    assert tier.compact() == 0  # nothing sparse is left
    keep = [3, 6, 7, 8, 9, 10, 11]
    assert served_is_right(tier, range(12)) == keep
    tier.close()
    tier = open_tier(tmp_path)
    assert served_is_right(tier, range(12)) == keep
    assert sorted(b.key for b in tier.recovered()) == sorted(key(i) for i in keep)
    tier.close()


def test_deletes_are_durable_after_flush_and_never_stale(tmp_path) -> None:
    tier = open_tier(tmp_path)
    fill(tier, range(4))
    tier._workers.drain()
    tier._sync()  # durable in the tail, no manifest yet
    tier.delete(key(2))
    tier._run_deferred()
    before_flush = snapshot(tmp_path)  # a crash now: the delete was not confirmed
    assert tier.flush()
    after_flush = snapshot(tmp_path)
    tier.close()
    tier = open_tier(before_flush)
    assert served_is_right(tier, range(4)) in ([0, 1, 2, 3], [0, 1, 3])
    tier.close()
    tier = open_tier(after_flush)
    assert served_is_right(tier, range(4)) == [0, 1, 3] and len(tier) == 3
    assert tier.counters.stale_entries == 0 and tier.counters.corrupt_quarantined == 0
    tier.close()
    # A manifest row pointing at a zeroed header (written by hand here) reads as a miss.
    tier = open_tier(after_flush)
    path, off = tier.location_of(key(1))
    tier.close()
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(bytes(RECORD_HEADER_BYTES))
    tier = open_tier(after_flush)
    assert served_is_right(tier, range(4)) == [0, 3] and tier.counters.stale_entries == 1
    tier.close()


def test_a_block_deleted_before_its_write_leaves_no_open_slot(tmp_path) -> None:
    tier = open_tier(tmp_path, fsync=False)
    gate = threading.Event()
    tier._workers.submit(gate.wait)  # hold the writer threads so the writes stay queued
    tier._workers.submit(gate.wait)
    fill(tier, range(4))
    for i in range(4):
        tier.delete(key(i))
    gate.set()
    assert tier.flush()
    seg = tier._segments[0]
    assert not seg.open_slots and seg.live == 0 and len(tier) == 0
    fill(tier, range(4, 12))
    assert tier.flush()
    tier.compact()
    assert 0 not in tier._segments  # the emptied segment could be retired
    assert served_is_right(tier, range(12)) == list(range(4, 12))
    tier.close()


def test_get_many_coalesces_adjacent_records(tmp_path, monkeypatch) -> None:
    tier = open_tier(tmp_path, segment_bytes=64 * 4096)
    fill(tier, range(20))
    assert tier.flush()
    runs: list[int] = []
    real = tier._read_run
    monkeypatch.setattr(
        tier,
        "_read_run",
        lambda keys, dest=None, fds=None: runs.append(len(keys)) or real(keys, dest, fds),
    )
    pages = tier.get_many([key(i) for i in [*range(20), 99]])  # 99: absent
    assert sorted(runs) == [1, 20]  # one read for the twenty adjacent records
    assert pages[-1] is None and served_is_right(tier, range(20)) == list(range(20))
    ids = [7, 3, 3, 12, 99, 0]  # any order, duplicates, a miss
    for i, p in zip(ids, tier.get_many([key(i) for i in ids])):
        assert (p is None) if i == 99 else torch.equal(p, page_of(i))
    tier.close()


def test_get_many_into_reads_into_the_callers_buffer(tmp_path) -> None:
    tier = open_tier(tmp_path, segment_bytes=64 * 4096)
    fill(tier, range(8))
    assert tier.flush()
    fill(tier, [8])  # may still be pending: served from memory into the buffer too
    out = torch.full((5, *PAGE), -1.0, dtype=torch.bfloat16)
    ids = [2, 3, 4, 42, 8]
    assert tier.get_many_into([key(i) for i in ids], out) == [True, True, True, False, True]
    for row, i in zip(out, ids):
        assert i == 42 or torch.equal(row, page_of(i))
    path, off = tier.location_of(key(3))
    _flip(Path(path), off + RECORD_HEADER_BYTES + 1)
    assert tier.get_many_into([key(i) for i in ids[:3]], out[:3]) == [True, False, True]
    assert tier.counters.corrupt_quarantined == 1 and key(3) not in tier
    with pytest.raises(ValueError, match="shape"):
        tier.get_many_into([key(2)], out)
    with pytest.raises(TypeError, match="out"):
        tier.get_many_into([key(2)], torch.zeros(1, *PAGE))
    tier.close()


def test_pending_blocks_are_served_from_memory_and_put_checks_arguments(tmp_path) -> None:
    tier = open_tier(tmp_path, capacity_bytes=2 * 4096)  # two records
    assert tier.put(key(0), page_of(0), meta(0))
    assert torch.equal(tier.get(key(0)), page_of(0))  # pending or durable: same bytes
    assert tier.put(key(1), page_of(1), meta(1)) and not tier.put(key(2), page_of(2), meta(2))
    with pytest.raises(ValueError, match="meta"):
        tier.put(key(3), page_of(3), None)
    with pytest.raises(ValueError, match="retention"):
        tier.put(key(3), page_of(3), BlockMeta(None, "x" * 33, 2e9))
    with pytest.raises(ValueError, match="page"):
        tier.put(key(3), torch.zeros(2, 2), meta(3))
    with pytest.raises(ValueError, match="compact_below"):
        open_tier(tmp_path / "other", compact_below=1.5)
    tier.close()


def test_lock_and_failed_open_release(tmp_path) -> None:
    tier = open_tier(tmp_path)
    with pytest.raises(CacheLockedError):
        open_tier(tmp_path)
    tier.close()
    with pytest.raises(TypeError):
        SegmentDiskTier(tmp_path, PAGE, "bf16", 1 << 20)  # type: ignore[arg-type]
    open_tier(tmp_path).close()  # the failed open left no lock


def test_segment_of_another_geometry_is_quarantined(tmp_path) -> None:
    tier = open_tier(tmp_path)
    fill(tier, range(3))
    tier.close()
    other = SegmentDiskTier(tmp_path, (2, 3, 5), torch.bfloat16, 1 << 24)
    assert len(other) == 0 and other.counters.manifest_rejected == 1
    assert other.counters.corrupt_quarantined == 1  # the segment, moved aside whole
    other.close()
    moved = {p.name.split(".")[0]: os.path.getsize(p) for p in (tmp_path / "quarantine").iterdir()}
    assert moved["0000000000000000"] >= SEGMENT_HEADER_BYTES and "manifest" in moved


def test_a_run_is_read_and_checked_in_pieces(tmp_path, monkeypatch) -> None:
    """A run longer than ``_HOT_BYTES`` is read by several ``preadv`` calls, each piece checked
    right after its read: a damaged record in the middle is the only miss."""
    from deepinfer_cache.tiers import segment_read

    monkeypatch.setattr(segment_read, "_HOT_BYTES", 3 * 4096)  # three records per preadv
    tier = open_tier(tmp_path, segment_bytes=16 * 4096)
    fill(tier, range(12))
    assert tier.flush()
    path, off = tier.location_of(key(7))
    _flip(path, off + RECORD_HEADER_BYTES + 3)
    assert tier._runs([key(i) for i in range(12)]) == [list(range(12))]  # one run
    assert served_is_right(tier, range(12)) == [i for i in range(12) if i != 7]
    assert tier.counters.corrupt_quarantined == 1 and tier.counters.blocks_read == 11
    tier.close()
