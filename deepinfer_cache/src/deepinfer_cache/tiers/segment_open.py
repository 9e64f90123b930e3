"""Opening a segment directory: read the manifest, scan only what it does not cover.

A reopen reads one file (the manifest) for every record written before the last checkpoint,
and reads the slots written after it (the "tail") in full, checking both checksums: a tail
record that fails (a write torn by a crash) is skipped and counted as ``torn_records``, never
indexed. Segments older than the manifest's ``next_segment`` that it does not list were
retired (compacted or emptied) before the crash and are deleted unread. A damaged manifest is
moved to quarantine and every segment is scanned instead: slower, never wrong.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..disk_format import CorruptBlockError
from ..index_bulk import RecoveredColumns
from ..segment_format import (
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    Geometry,
    Manifest,
    check_record,
    check_segment_header,
    is_blank,
    parse_segment_name,
    read_manifest_file,
    slot_offset,
)
from ._locations import LocationTable, Rec

_SCAN_SLOTS = 64  # slots read per pread while scanning a tail


@dataclass
class OpenState:
    loc: dict[bytes, Rec] = field(default_factory=dict)  # records found by the tail scan
    table: LocationTable = field(default_factory=LocationTable)  # every live record
    columns: RecoveredColumns | None = None  # the manifest's rows, when nothing overrode them
    slots: dict[int, int] = field(default_factory=dict)  # segment id -> slots in its file
    next_segment: int = 0
    manifest_found: bool = False
    tail_records: int = 0  # records found by scanning (the manifest did not list them)
    torn_records: int = 0
    stale_entries: int = 0
    corrupt: int = 0
    manifest_rejected: int = 0
    segments_retired: int = 0


def load_segments(
    seg_dir: str,
    manifest_path: str,
    geometry: Geometry,
    quarantine: Callable[[str, str], None],
    quarantine_odd: Callable[[str, str], None],
) -> OpenState:
    st = OpenState()
    files: dict[int, str] = {}
    with os.scandir(seg_dir) as it:
        entries = list(it)
    for e in entries:
        sid = parse_segment_name(e.name)
        if sid is None or not e.is_file(follow_symlinks=False):
            quarantine_odd(e.path, e.name)  # links, FIFOs, strangers: moved aside unopened
            continue
        files[sid] = e.path

    manifest: Manifest | None = None
    if os.path.lexists(manifest_path):
        try:
            if not os.path.isfile(manifest_path) or os.path.islink(manifest_path):
                raise CorruptBlockError("manifest is not a regular file")
            manifest = read_manifest_file(manifest_path, geometry)
        except (CorruptBlockError, OSError):
            st.manifest_rejected += 1
            quarantine(manifest_path, "manifest")
    st.manifest_found = manifest is not None

    covered: dict[int, int] = {}
    if manifest is not None:
        st.next_segment = manifest.next_segment
        for sid in sorted(files):
            if sid < manifest.next_segment and sid not in manifest.segments:
                with contextlib.suppress(OSError):
                    os.unlink(files.pop(sid))  # retired before the crash
                st.segments_retired += 1
        covered = {s: n for s, n in manifest.segments.items() if s in files}

    for sid, path in sorted(files.items()):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            quarantine(path, os.path.basename(path))
            covered.pop(sid, None)
            continue
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, SEGMENT_HEADER_BYTES, 0)
            check_segment_header(head, geometry, sid)
        except (CorruptBlockError, OSError):
            os.close(fd)
            st.corrupt += 1
            quarantine(path, os.path.basename(path))
            covered.pop(sid, None)
            continue
        try:
            n_slots = max(0, (size - SEGMENT_HEADER_BYTES) // geometry.slot_bytes)
            # A last slot may end with a short payload tail (the file is not padded).
            if slot_offset(n_slots, geometry.slot_bytes) + RECORD_HEADER_BYTES <= size:
                n_slots += 1
            start = min(covered.get(sid, 0), n_slots)
            st.slots[sid] = max(n_slots, covered.get(sid, 0))
            st.next_segment = max(st.next_segment, sid + 1)
            _scan_tail(fd, sid, start, n_slots, geometry, st, quarantine, path)
        finally:
            os.close(fd)

    if manifest is not None:
        _apply_manifest(manifest, covered, files, geometry, st)
    for key, rec in st.loc.items():  # a tail record of a key (written later) wins
        st.table[key] = rec
    return st


def _apply_manifest(
    m: Manifest, covered: dict[int, int], files: dict[int, str], geometry: Geometry, st: OpenState
) -> None:
    """Manifest rows pointing into a segment that exists and covers them become the location
    table (kept as numpy rows: see ``_locations``); ``load_segments`` then lays the tail
    records over it. Column-wise: the only per-row Python work is one ``key -> row`` dict."""
    rows = m.rows
    if not len(rows):
        return
    segs_u, inv = np.unique(rows["segment"], return_inverse=True)
    limit = np.array([covered.get(int(u), 0) for u in segs_u], dtype=np.int64)[inv]
    ok = rows["slot"].astype(np.int64) < limit
    # A row past its segment's covered prefix is stale (segment vanished or damaged) unless
    # the tail scan found that very record (earlier versions listed records synced past a
    # write still in flight; the tail scan reads those slots and vouches for them).
    for i in np.flatnonzero(~ok).tolist():
        r = st.loc.get(rows["key"][i].tobytes())
        if r is None or (r[0], r[1]) != (int(rows["segment"][i]), int(rows["slot"][i])):
            st.stale_entries += 1
    rows = rows[ok]  # a copy: the table owns it
    n = len(rows)
    key_array = np.ascontiguousarray(rows["key"]).view("V16").reshape(n)
    # ``tolist`` of a 16-byte void column gives one ``bytes`` per row in a C loop (an "S16"
    # column would drop trailing zero bytes of a hash).
    keys: list[bytes] = key_array.tolist()
    pos = dict(zip(keys, range(n)))  # a later duplicate row wins, as it always did
    st.table = LocationTable(rows, m.classes, pos)
    if not st.loc and len(pos) == n:
        flags = rows["flags"]
        st.columns = RecoveredColumns(
            keys,
            key_array=key_array.view("S16"),
            parent_array=np.ascontiguousarray(rows["parent"]).view("S16").reshape(n),
            has_parent=(flags & 1).astype(bool),
            tenant_array=np.ascontiguousarray(rows["tenant"]).view("S16").reshape(n),
            has_tenant=(flags & 2).astype(bool),
            retention_codes=rows["cls"],
            retention_names=list(m.classes),
            expires_array=rows["expires"].astype(np.float64),
            key_pos=pos.copy(),  # the index takes this one over; the table keeps its own
        )


def _scan_tail(
    fd: int,
    sid: int,
    start: int,
    n_slots: int,
    geometry: Geometry,
    st: OpenState,
    quarantine: Callable[[str, str], None],
    path: str,
) -> None:
    sb = geometry.slot_bytes
    rec_len = RECORD_HEADER_BYTES + geometry.page_bytes
    slot = start
    while slot < n_slots:
        n = min(_SCAN_SLOTS, n_slots - slot)
        buf = os.pread(fd, n * sb, slot_offset(slot, sb))
        view = memoryview(buf)
        for j in range(n):
            rec = view[j * sb : j * sb + rec_len]
            if len(rec) < RECORD_HEADER_BYTES or is_blank(rec):
                continue  # never written (a hole left by a crash) or deleted
            try:
                h = check_record(rec, geometry, sid, slot + j, None)
            except CorruptBlockError:
                st.torn_records += 1  # after the last checkpoint: a torn write, never served
                continue
            m = h.meta
            st.loc[h.key] = (
                sid,
                slot + j,
                m.parent,
                m.tenant,
                m.retention,
                m.expires_at,
                h.payload_xxh3,
            )
            st.tail_records += 1
        slot += n


def quarantine_name(name: str) -> str:
    return f"{name}.{time.time_ns()}"
