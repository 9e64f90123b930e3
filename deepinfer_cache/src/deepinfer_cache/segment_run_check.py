"""The record headers of a whole run checked in one pass (numpy), for ``SegmentDiskTier``.

Why: ``check_record_parts`` decodes one header into Python objects (a struct unpack, a
``BlockMeta``, a ``RecordHeader``) per record, which a read that only needs yes or no pays for
every block of every request. Here the same conditions are evaluated for all ``n`` headers at
once over a structured view of the header buffer: magic, version, retention length, payload
length, segment, slot, key, payload XXH3-64 against the digest the reader computed, and the
header CRC32 (one ``zlib.crc32`` call per header: the only per-record step), plus the
retention name's UTF-8 for the records that pass. A record passes here exactly when
``check_record_parts`` would accept it (tested against it with hypothesis); the caller runs
``check_record_parts`` on the failures only when it wants the reason.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from .segment_format import (
    MAX_RETENTION_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_MAGIC,
    SEGMENT_VERSION,
)

# The record header's layout (segment_format._RECORD, then its u32 CRC) as one packed row.
_ROW = np.dtype(
    [
        ("magic", "S4"),
        ("version", "<u2"),
        ("flags", "u1"),
        ("rlen", "u1"),
        ("key", "u1", (16,)),
        ("parent", "u1", (16,)),
        ("tenant", "u1", (16,)),
        ("expires", "<f8"),
        ("payload_len", "<u8"),
        ("payload_xxh3", "<u8"),
        ("segment", "<u8"),
        ("slot", "<u4"),
        ("retention", "u1", (32,)),
        ("crc", "<u4"),
    ]
)
_CRC_SPAN = RECORD_HEADER_BYTES - 4  # the CRC covers everything before it
_NAME_AT = 92  # offset of the 32-byte retention name in a header
assert _ROW.itemsize == RECORD_HEADER_BYTES
assert _ROW.fields is not None and _ROW.fields["retention"][1] == _NAME_AT


def check_run_heads(
    heads: bytes | bytearray | memoryview,
    *,
    page_bytes: int,
    segment: int,
    first_slot: int,
    keys: Sequence[bytes],
    digests: Sequence[int],
) -> list[bool]:
    """Per record of a run (``len(keys)`` headers back to back in ``heads``, in slots
    ``first_slot``, ``first_slot + 1``, ... of ``segment``): whether its header is intact and
    names that key, segment, slot and a payload of ``page_bytes`` whose XXH3-64 is
    ``digests[i]``."""
    n = len(keys)
    if len(digests) != n or memoryview(heads).nbytes < n * RECORD_HEADER_BYTES:
        raise ValueError(f"need {n} digests and {n * RECORD_HEADER_BYTES} bytes of headers")
    if n == 0:
        return []
    rows = np.frombuffer(heads, dtype=_ROW, count=n)
    want_keys = np.frombuffer(b"".join(keys), dtype=np.uint8)
    if want_keys.size != 16 * n:
        raise ValueError("keys must be 16 bytes each")
    ok = (
        (rows["magic"] == RECORD_MAGIC)
        & (rows["version"] == SEGMENT_VERSION)
        & (rows["rlen"] <= MAX_RETENTION_BYTES)
        & (rows["payload_len"] == page_bytes)
        & (rows["segment"] == segment)
        & (rows["slot"] == np.arange(first_slot, first_slot + n, dtype=np.uint64))
        & (rows["payload_xxh3"] == np.asarray(digests, dtype=np.uint64))
        & (rows["key"] == want_keys.reshape(n, 16)).all(axis=1)
    )
    view = memoryview(heads).cast("B")
    crcs = rows["crc"].tolist()
    rlens = rows["rlen"].tolist()
    result: list[bool] = ok.tolist()
    for j in range(n):
        if not result[j]:
            continue
        at = j * RECORD_HEADER_BYTES
        if zlib.crc32(view[at : at + _CRC_SPAN]) != crcs[j]:
            result[j] = False
            continue
        name_at = at + _NAME_AT
        try:
            bytes(view[name_at : name_at + rlens[j]]).decode()
        except UnicodeDecodeError:
            result[j] = False
    return result


__all__ = ["check_run_heads"]
