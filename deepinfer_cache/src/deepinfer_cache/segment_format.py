"""Segment (log-structured) disk format: many blocks per file, one manifest (no pickle).

A segment file ``segments/<16 hex id>.seg`` is a header followed by fixed-size slots::

    offset 0       segment header, SEGMENT_HEADER_BYTES: magic b"DIKVSEG\\0", u16 version,
                   u32 meta_len, JSON {dtype, shape, layout, page_bytes, slot_bytes, segment},
                   u32 crc32 of what precedes it, space padding
    offset 4096    slot 0, slot 1, ... each ``slot_bytes`` (a multiple of ALIGN):
                   RECORD_HEADER_BYTES record header, then the raw little-endian payload

Record header (128 bytes, little-endian): magic b"DKVR", u16 version, u8 flags (1: has a
parent, 2: has a tenant tag), u8 retention length, 16-byte key, parent, tenant, f64
expires_at, u64 payload_len, u64 payload XXH3-64, u64 segment id, u32 slot, 32 bytes of
retention name, u32 crc32 of the 124 bytes before it. The segment id and slot are inside the checked
header, so a record found anywhere else (a stale manifest, a copied file) fails its check.

The manifest ``manifest`` lists every live record: a header (magic b"DIKVMAN\\0", u16
version, u32 meta_len, JSON {geometry, next_segment, segments: {id: slots covered}, count,
classes, records_xxh3}, u32 crc32), then ``count`` rows of ``MANIFEST_DTYPE``. It is written
under a temporary name, fsynced and renamed (then the directory is fsynced), so a reader sees
the old manifest or the new one, never a mix. Anything that fails a check raises
``CorruptBlockError``.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
import xxhash

from .disk_format import CorruptBlockError, _dtype_name, _parse_dtype, _write_all, fsync_dir
from .meta import BlockMeta

SEGMENT_MAGIC = b"DIKVSEG\x00"
RECORD_MAGIC = b"DKVR"
MANIFEST_MAGIC = b"DIKVMAN\x00"
SEGMENT_VERSION = 1
ALIGN = 4096
SEGMENT_HEADER_BYTES = 4096
_PREFIX = struct.Struct("<8sHI")
_CRC = struct.Struct("<I")
_RECORD = struct.Struct("<4sHBB16s16s16sdQQQI32s")
RECORD_HEADER_BYTES = _RECORD.size + _CRC.size  # 128
MAX_RETENTION_BYTES = 32  # RetentionPolicy allows 1-32 byte names
_HAS_PARENT = 1
_HAS_TENANT = 2
_ZERO16 = bytes(16)

# One row per live record. Keys are raw bytes in uint8 columns (numpy "S" types would drop
# trailing zero bytes of a hash).
MANIFEST_DTYPE = np.dtype(
    [
        ("key", "u1", (16,)),
        ("parent", "u1", (16,)),
        ("tenant", "u1", (16,)),
        ("flags", "<u2"),
        ("cls", "<u2"),
        ("slot", "<u4"),
        ("segment", "<u8"),
        ("expires", "<f8"),
        ("xxh3", "<u8"),
    ]
)


def slot_bytes_for(page_bytes: int) -> int:
    need = RECORD_HEADER_BYTES + page_bytes
    return need + (-need % ALIGN)


def slot_offset(slot: int, slot_bytes: int) -> int:
    return SEGMENT_HEADER_BYTES + slot * slot_bytes


def segment_name(segment: int) -> str:
    return f"{segment:016x}.seg"


def parse_segment_name(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    if ext != "seg" or not dot or len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class Geometry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    layout: str
    page_bytes: int
    slot_bytes: int

    def doc(self) -> dict[str, Any]:
        return {
            "dtype": _dtype_name(self.dtype),
            "shape": list(self.shape),
            "layout": self.layout,
            "page_bytes": self.page_bytes,
            "slot_bytes": self.slot_bytes,
        }

    @cached_property
    def header_json_parts(self) -> tuple[bytes, bytes]:
        """The segment header's JSON before and after the segment id (see
        ``encode_segment_header``): ``{**doc(), "segment": id}`` with sorted keys."""
        marker = "\x00segment-id\x00"
        text = json.dumps({**self.doc(), "segment": marker}, separators=(",", ":"), sort_keys=True)
        before, _, after = text.partition(json.dumps(marker))
        return before.encode(), after.encode()

    def check(self, doc: dict[str, Any], what: str) -> None:
        try:
            same = (
                _parse_dtype(doc["dtype"]) == self.dtype
                and tuple(int(s) for s in doc["shape"]) == self.shape
                and doc["layout"] == self.layout
                and int(doc["page_bytes"]) == self.page_bytes
                and int(doc["slot_bytes"]) == self.slot_bytes
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptBlockError(f"{what}: bad geometry fields: {exc}") from exc
        if not same:
            raise CorruptBlockError(f"{what} is for another page geometry: {doc}")


# ---------------------------------------------------------------------- headers with JSON
def _encode_json_header(magic: bytes, doc: dict[str, Any], pad_to: int = 1) -> bytes:
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    fixed = _PREFIX.size + _CRC.size
    body += b" " * (-(fixed + len(body)) % pad_to)
    head = _PREFIX.pack(magic, SEGMENT_VERSION, len(body)) + body
    return head + _CRC.pack(zlib.crc32(head))


def _decode_json_header(
    buf: bytes | memoryview, magic: bytes, what: str
) -> tuple[dict[str, Any], int]:
    if len(buf) < _PREFIX.size:
        raise CorruptBlockError(f"{what}: shorter than its fixed header")
    got, version, meta_len = _PREFIX.unpack_from(buf, 0)
    if got != magic:
        raise CorruptBlockError(f"{what}: bad magic")
    if version != SEGMENT_VERSION:
        raise CorruptBlockError(f"{what}: unsupported version {version}")
    end = _PREFIX.size + meta_len
    if len(buf) < end + _CRC.size:
        raise CorruptBlockError(f"{what}: truncated header")
    if zlib.crc32(buf[:end]) != _CRC.unpack_from(buf, end)[0]:
        raise CorruptBlockError(f"{what}: header checksum mismatch")
    try:
        doc = json.loads(bytes(buf[_PREFIX.size : end]))
    except ValueError as exc:
        raise CorruptBlockError(f"{what}: bad header JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CorruptBlockError(f"{what}: header is not an object")
    return doc, end + _CRC.size


def encode_segment_header(geometry: Geometry, segment: int) -> bytes:
    # The JSON around the segment id is the same for every segment of a geometry: it is
    # encoded once (a reopen checks thousands of headers), and the id is spliced in as the
    # decimal ``json.dumps`` writes for an int.
    before, after = geometry.header_json_parts
    body = before + str(int(segment)).encode() + after
    fixed = _PREFIX.size + _CRC.size
    body += b" " * (-(fixed + len(body)) % SEGMENT_HEADER_BYTES)
    head = _PREFIX.pack(SEGMENT_MAGIC, SEGMENT_VERSION, len(body)) + body
    head += _CRC.pack(zlib.crc32(head))
    if len(head) != SEGMENT_HEADER_BYTES:
        raise ValueError("page shape too long for the segment header")
    return head


def check_segment_header(buf: bytes | memoryview, geometry: Geometry, segment: int) -> None:
    if bytes(buf[:SEGMENT_HEADER_BYTES]) == encode_segment_header(geometry, segment):
        return  # the usual case, without parsing (a reopen checks thousands of these)
    doc, _ = _decode_json_header(buf, SEGMENT_MAGIC, "segment")
    geometry.check(doc, "segment")
    if doc.get("segment") != segment:
        raise CorruptBlockError(f"segment header names segment {doc.get('segment')}")
    raise CorruptBlockError("segment header is not the one this geometry writes")


# ---------------------------------------------------------------------- records
@dataclass(frozen=True)
class RecordHeader:
    key: bytes
    meta: BlockMeta
    payload_len: int
    payload_xxh3: int
    segment: int
    slot: int


def encode_record_header(
    key: bytes, meta: BlockMeta, payload_len: int, payload_xxh3: int, segment: int, slot: int
) -> bytes:
    ret = meta.retention.encode()
    if len(ret) > MAX_RETENTION_BYTES:
        raise ValueError(f"retention class names are at most {MAX_RETENTION_BYTES} bytes")
    flags = (_HAS_PARENT if meta.parent is not None else 0) | (
        _HAS_TENANT if meta.tenant is not None else 0
    )
    head = _RECORD.pack(
        RECORD_MAGIC,
        SEGMENT_VERSION,
        flags,
        len(ret),
        key,
        meta.parent or _ZERO16,
        meta.tenant or _ZERO16,
        meta.expires_at,
        payload_len,
        payload_xxh3,
        segment,
        slot,
        ret,
    )
    return head + _CRC.pack(zlib.crc32(head))


def decode_record_header(buf: bytes | memoryview) -> RecordHeader:
    if len(buf) < RECORD_HEADER_BYTES:
        raise CorruptBlockError("record shorter than its header")
    fields = _RECORD.unpack_from(buf, 0)
    magic, version, flags, rlen, key, parent, tenant, expires, plen, check, seg, slot, ret = fields
    if magic != RECORD_MAGIC:
        raise CorruptBlockError("bad record magic")
    if zlib.crc32(buf[: _RECORD.size]) != _CRC.unpack_from(buf, _RECORD.size)[0]:
        raise CorruptBlockError("record header checksum mismatch")
    if version != SEGMENT_VERSION or rlen > MAX_RETENTION_BYTES:
        raise CorruptBlockError("bad record header fields")
    try:
        retention = ret[:rlen].decode()
    except UnicodeDecodeError as exc:
        raise CorruptBlockError("bad retention name") from exc
    meta = BlockMeta(
        parent if flags & _HAS_PARENT else None,
        retention,
        expires,
        tenant if flags & _HAS_TENANT else None,
    )
    return RecordHeader(key, meta, plen, check, seg, slot)


def is_blank(buf: bytes | memoryview) -> bool:
    """An all-zero record header: a hole never written, or a record deleted on purpose."""
    return bytes(buf[:RECORD_HEADER_BYTES]) == bytes(RECORD_HEADER_BYTES)


def check_record(
    buf: bytes | memoryview, geometry: Geometry, segment: int, slot: int, key: bytes | None
) -> RecordHeader:
    """Verify a whole record (header and payload checksum) read from ``segment``/``slot``."""
    view = memoryview(buf)
    return check_record_parts(
        view[:RECORD_HEADER_BYTES], view[RECORD_HEADER_BYTES:], geometry, segment, slot, key
    )


def check_record_parts(
    head: bytes | memoryview,
    payload: bytes | memoryview,
    geometry: Geometry,
    segment: int,
    slot: int,
    key: bytes | None,
    payload_xxh3: int | None = None,
) -> RecordHeader:
    """``check_record`` for a header and a payload read into separate buffers
    (``payload_xxh3``: the XXH3-64 of the whole ``payload`` when the reader already computed
    it piece by piece; it is compared only once the header has passed its checks)."""
    h = decode_record_header(head)
    if h.segment != segment or h.slot != slot:
        raise CorruptBlockError("record is not where its header says")
    if key is not None and h.key != key:
        raise CorruptBlockError("block hash in record header does not match")
    if h.payload_len != geometry.page_bytes:
        raise CorruptBlockError(
            f"payload is {h.payload_len} bytes, tier pages are {geometry.page_bytes}"
        )
    if memoryview(payload).nbytes < h.payload_len:
        raise CorruptBlockError("record truncated")
    if payload_xxh3 is not None and memoryview(payload).nbytes == h.payload_len:
        digest = payload_xxh3
    else:
        digest = xxhash.xxh3_64_intdigest(memoryview(payload)[: h.payload_len])
    if digest != h.payload_xxh3:
        raise CorruptBlockError("payload checksum mismatch")
    return h


# ---------------------------------------------------------------------- manifest
@dataclass
class Manifest:
    next_segment: int
    segments: dict[int, int]  # segment id -> slots the manifest covers
    classes: list[str]
    rows: np.ndarray  # MANIFEST_DTYPE


def encode_manifest(geometry: Geometry, m: Manifest) -> tuple[bytes, memoryview]:
    rows: Any = np.ascontiguousarray(m.rows, dtype=MANIFEST_DTYPE)
    body = memoryview(rows).cast("B")
    doc = {
        **geometry.doc(),
        "next_segment": m.next_segment,
        "segments": {f"{s:x}": n for s, n in sorted(m.segments.items())},
        "classes": m.classes,
        "count": len(m.rows),
        "records_xxh3": xxhash.xxh3_64_intdigest(body),
    }
    return _encode_json_header(MANIFEST_MAGIC, doc), body


def decode_manifest(buf: bytes | memoryview, geometry: Geometry) -> Manifest:
    doc, off = _decode_json_header(buf, MANIFEST_MAGIC, "manifest")
    geometry.check(doc, "manifest")
    try:
        count = int(doc["count"])
        segments = {int(s, 16): int(n) for s, n in doc["segments"].items()}
        classes = [str(c) for c in doc["classes"]]
        next_segment = int(doc["next_segment"])
        check = int(doc["records_xxh3"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptBlockError(f"manifest: bad header fields: {exc}") from exc
    body = memoryview(buf)[off:]
    if count < 0 or body.nbytes != count * MANIFEST_DTYPE.itemsize:
        raise CorruptBlockError(f"manifest: {body.nbytes} record bytes for {count} records")
    if xxhash.xxh3_64_intdigest(body) != check:
        raise CorruptBlockError("manifest: records checksum mismatch")
    rows = np.frombuffer(body, dtype=MANIFEST_DTYPE)
    if count and (int(rows["cls"].max()) >= len(classes)):
        raise CorruptBlockError("manifest: retention class index out of range")
    return Manifest(next_segment, segments, classes, rows)


def write_manifest_file(
    path: str, tmp_path: str, head: bytes, body: memoryview, fsync: bool
) -> None:
    """tmp -> fsync -> rename -> fsync dir: a reader sees the old manifest or the new one."""
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, head)
        _write_all(fd, body)
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp_path)
        raise
    os.close(fd)
    os.replace(tmp_path, path)
    if fsync:
        fsync_dir(os.path.dirname(path))


def read_manifest_file(path: str, geometry: Geometry) -> Manifest:
    with open(path, "rb", buffering=0) as f:
        data = f.read()
    return decode_manifest(data, geometry)
