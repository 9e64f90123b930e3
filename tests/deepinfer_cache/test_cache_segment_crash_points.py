"""SegmentDiskTier at exact crash points (deterministic twins of the SIGKILL loop).

A crash is simulated by copying the directory at a chosen moment: before every write the
tier makes (and halfway through it: a torn write), and while a write is still in flight
when a manifest is written. Every copy must reopen with nothing stale and nothing corrupt
(a torn write that was never reported durable is a torn tail, not damage), keep every block
``flush()`` confirmed and never bring back a deletion ``flush()`` confirmed."""

from __future__ import annotations

import contextlib
import shutil
import threading
from pathlib import Path

import torch

from deepinfer_cache import BlockMeta, SegmentDiskTier
from deepinfer_cache.segment_format import Geometry, read_manifest_file, slot_bytes_for
from deepinfer_cache.tiers import segment_maintenance as maint_mod
from deepinfer_cache.tiers import segment_write as seg_mod

PAGE = (2, 3, 4)


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def page_of(i: int) -> torch.Tensor:
    return torch.arange(24, dtype=torch.float32).reshape(PAGE) + 1000.0 * i


def meta(i: int) -> BlockMeta:
    return BlockMeta(None, "chat", 2e9 + i)


def open_tier(path, **kw) -> SegmentDiskTier:
    kw.setdefault("segment_bytes", 4 * 4096)  # four slots per segment: many segments
    return SegmentDiskTier(path, PAGE, torch.float32, 1 << 24, io_threads=1, **kw)


def fill(tier: SegmentDiskTier, ids) -> None:
    for i in ids:
        assert tier.put(key(i), page_of(i), meta(i), block=True)


def copy_dir(src: Path, dst: Path) -> None:
    """What a crash now would leave (a retired segment unlinked meanwhile is simply gone)."""

    def copy(a: str, b: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(a, b)

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"), copy_function=copy)


def check_reopen(crash: Path, must_have: set[int], must_not: set[int]) -> None:
    tier = open_tier(crash)
    try:
        c = tier.counters
        assert c.corrupt_quarantined == 0, f"{crash.name}: a crash left 'corruption'"
        assert c.stale_entries == 0, f"{crash.name}: the manifest lists a dead record"
        ids = sorted(must_have | must_not | set(range(16)))
        found = set()
        for i, page in zip(ids, tier.get_many([key(i) for i in ids])):
            if page is not None:
                assert torch.equal(page, page_of(i)), f"{crash.name}: block {i} wrong bytes"
                found.add(i)
        assert must_have <= found, f"{crash.name}: lost durable blocks {must_have - found}"
        assert not (must_not & found), f"{crash.name}: deletions came back {must_not & found}"
        assert c.corrupt_quarantined == 0 and c.stale_entries == 0, crash.name
    finally:
        tier.close()


def test_a_crash_before_or_inside_any_write_leaves_nothing_stale_or_corrupt(
    tmp_path, monkeypatch
) -> None:
    live = tmp_path / "live"
    crashes: list[tuple[Path, set[int], set[int]]] = []
    must_have: set[int] = set()
    must_not: set[int] = set()
    guard = threading.Lock()

    def crash_here() -> None:
        dst = tmp_path / f"crash{len(crashes):03d}"
        copy_dir(live, dst)
        crashes.append((dst, set(must_have), set(must_not)))

    real_pwrite = seg_mod._pwrite_all

    def pwrite(fd: int, bufs: list, offset: int) -> None:
        with guard:
            crash_here()  # killed before the write
            data = b"".join(bytes(memoryview(b).cast("B")) for b in bufs)
            if len(data) > 1:
                real_pwrite(fd, [data[: len(data) // 2]], offset)
                crash_here()  # killed halfway through it (a torn write)
                real_pwrite(fd, [data[len(data) // 2 :]], offset + len(data) // 2)
            else:
                real_pwrite(fd, [data], offset)

    real_manifest = maint_mod.write_manifest_file

    def manifest(*args, **kw) -> None:
        with guard:
            crash_here()
            real_manifest(*args, **kw)

    monkeypatch.setattr(seg_mod, "_pwrite_all", pwrite)
    monkeypatch.setattr(maint_mod, "_pwrite_all", pwrite)
    monkeypatch.setattr(maint_mod, "write_manifest_file", manifest)

    tier = open_tier(live, compact_below=0.5, checkpoint_every=3)
    fill(tier, range(10))  # three segments: each one's creation is a crash point too
    assert tier.flush()
    must_have |= set(range(10))
    for i in (0, 1, 2, 5, 6):  # first segment sparse, second half empty
        tier.delete(key(i))
        must_have.discard(i)
    assert tier.flush()
    tier.compact()  # live records copied forward, the old segments retired
    must_not |= {0, 1, 2, 5, 6}
    fill(tier, range(10, 16))
    assert tier.flush()
    must_have |= set(range(10, 16))
    tier.close()
    monkeypatch.undo()

    assert tier.counters.segments_retired >= 1 and tier.counters.records_compacted >= 1
    assert len(crashes) > 40
    for crash, have, gone in crashes:
        check_reopen(crash, have, gone)


def test_a_write_in_flight_during_a_checkpoint_does_not_make_later_records_stale(
    tmp_path, monkeypatch
) -> None:
    """A slow write (or a compaction's copy) holds slot 2 while slots 3-5 are written, synced
    and checkpointed: the manifest may only vouch for the prefix below the open slot, and the
    records past it are found by the tail scan, never counted stale."""
    live = tmp_path / "live"
    tier = open_tier(live, segment_bytes=8 * 4096)
    fill(tier, range(2))
    assert tier.flush()
    with tier._lock:
        seg, held = tier._reserve()  # the write in flight: reserved, not yet on disk
    fill(tier, range(2, 5))
    assert tier.flush()  # writes the manifest while slot `held` is still open
    assert tier.location_of(key(4)) is not None  # durable
    crash = tmp_path / "crash"
    copy_dir(live, crash)
    # Earlier versions listed the records past the open slot too: such a manifest on disk
    # must reopen just as cleanly (the tail scan vouches for those rows).
    monkeypatch.setattr(maint_mod, "_within_covered", lambda rows, open_from: rows)
    assert tier._checkpoint(force=True)
    monkeypatch.undo()
    old_style = tmp_path / "old-style"
    copy_dir(live, old_style)
    with tier._lock:
        seg.open_slots.discard(held)  # the slow write gives up (its slot stays a hole)
    tier.close()

    page_bytes = 24 * 4
    g = Geometry(torch.float32, PAGE, "page", page_bytes, slot_bytes_for(page_bytes))
    m = read_manifest_file(str(crash / "manifest"), g)
    assert m.segments[seg.id] == held
    assert all(int(r["slot"]) < m.segments[int(r["segment"])] for r in m.rows)
    copy_dir(crash, tmp_path / "crash2")
    tier = open_tier(tmp_path / "crash2")
    assert tier.counters.tail_records_scanned == 3  # the slots past the open one
    tier.close()
    check_reopen(crash, set(range(5)), set())
    m = read_manifest_file(str(old_style / "manifest"), g)
    assert len(m.rows) == 5 and m.segments[seg.id] == held
    check_reopen(old_style, set(range(5)), set())
