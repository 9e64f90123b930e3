"""On-disk block format (no pickle) and its crash-safe write.

One file per block::

    offset 0   magic   8 bytes  b"DIKVBLK\\0"
    offset 8   version u16 LE   (FORMAT_VERSION)
    offset 10  meta_len u32 LE
    offset 14  meta    meta_len bytes of UTF-8 JSON: hash, parent, dtype, shape, layout,
                       retention, expires_at, tenant, payload_len, payload_xxh3
    ...        hdr_crc u32 LE   zlib.crc32 of bytes [0, 14 + meta_len)
    ...        payload payload_len raw little-endian element bytes of the contiguous page

Version 2 checks the payload with XXH3-64 (the ``xxhash`` package: about 15x less CPU than
CRC32 on a 2 MiB block, and a 64-bit check); version 1 files (``payload_crc32``) still read.

A file is written under a temporary name, fsynced, renamed into place and the directory is
fsynced, so after a crash a block file is either complete or absent. Anything that fails a
check (magic, version, header CRC, JSON fields, file size, payload CRC) raises
``CorruptBlockError``; callers treat it as a miss and quarantine the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from .meta import BlockMeta

MAGIC = b"DIKVBLK\x00"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
_PREFIX = struct.Struct("<8sHI")
_CRC = struct.Struct("<I")
_MAX_META = 1 << 16
HEADER_ALIGN = 512


class CorruptBlockError(ValueError):
    """A block file failed a format or checksum check."""


@dataclass(frozen=True)
class BlockHeader:
    key: bytes
    meta: BlockMeta
    dtype: torch.dtype
    shape: tuple[int, ...]
    layout: str
    payload_len: int
    payload_check: int  # XXH3-64 (version 2) or CRC32 (version 1) of the payload
    header_len: int
    version: int = FORMAT_VERSION

    def payload_ok(self, payload: bytes | memoryview) -> bool:
        if self.version == 1:
            return zlib.crc32(payload) == self.payload_check
        return bool(xxhash.xxh3_64_intdigest(payload) == self.payload_check)

    @property
    def file_len(self) -> int:
        return self.header_len + self.payload_len


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _parse_dtype(name: Any) -> torch.dtype:
    dt = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dt, torch.dtype):
        raise CorruptBlockError(f"unknown dtype {name!r}")
    return dt


def page_bytes_view(page: torch.Tensor) -> memoryview:
    """The page's raw bytes (a CPU, contiguous copy is made when needed)."""
    t = page.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    if sys.byteorder != "little":
        raise RuntimeError("big-endian hosts are not supported by the disk format")
    arr: Any = t.view(torch.uint8).numpy()
    return memoryview(arr).cast("B")


def encode_header(
    key: bytes,
    meta: BlockMeta,
    page: torch.Tensor,
    layout: str,
    payload: memoryview,
    *,
    align: int = HEADER_ALIGN,
) -> bytes:
    """The header for ``page``; the JSON is padded with spaces so the header length is a
    multiple of ``align`` (a fixed file size per tier makes capacity accounting exact)."""
    doc = {
        "hash": key.hex(),
        "parent": meta.parent.hex() if meta.parent is not None else None,
        "dtype": _dtype_name(page.dtype),
        "shape": list(page.shape),
        "layout": layout,
        "retention": meta.retention,
        "expires_at": meta.expires_at,
        "tenant": meta.tenant.hex() if meta.tenant is not None else None,
        "payload_len": payload.nbytes,
        "payload_xxh3": xxhash.xxh3_64_intdigest(payload),
    }
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    fixed = _PREFIX.size + _CRC.size
    body += b" " * (-(fixed + len(body)) % align)
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(body)) + body
    return head + _CRC.pack(zlib.crc32(head))


def max_header_len(
    shape: tuple[int, ...], dtype: torch.dtype, layout: str, retention_len: int = 32
) -> int:
    """Header length for the longest field values a block of this geometry can have."""
    page = torch.empty(shape, dtype=dtype, device="meta")
    meta = BlockMeta(b"\xff" * 16, "r" * retention_len, -1.7976931348623157e308, b"\xff" * 16)
    doc_payload = memoryview(b"")
    head = encode_header(b"\xff" * 16, meta, page, layout, doc_payload, align=1)
    # payload_len and payload_xxh3 grow to at most 20 digits each.
    fixed = len(head) + 20 + 20
    return fixed + (-fixed % HEADER_ALIGN)


def decode_header(buf: bytes | memoryview, file_len: int | None = None) -> BlockHeader:
    """Parse and check a header from the first bytes of a block file."""
    if len(buf) < _PREFIX.size:
        raise CorruptBlockError("file shorter than the fixed header")
    magic, version, meta_len = _PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptBlockError("bad magic")
    if version not in READABLE_VERSIONS:
        raise CorruptBlockError(f"unsupported format version {version}")
    if meta_len > _MAX_META:
        raise CorruptBlockError("header too long")
    end = _PREFIX.size + meta_len
    if len(buf) < end + _CRC.size:
        raise CorruptBlockError("truncated header")
    (crc,) = _CRC.unpack_from(buf, end)
    if zlib.crc32(buf[:end]) != crc:
        raise CorruptBlockError("header checksum mismatch")
    try:
        doc = json.loads(bytes(buf[_PREFIX.size : end]))
        key = bytes.fromhex(doc["hash"])
        parent = bytes.fromhex(doc["parent"]) if doc["parent"] is not None else None
        tenant_hex = doc.get("tenant")  # absent in files written before it existed
        tenant = bytes.fromhex(tenant_hex) if tenant_hex is not None else None
        shape = tuple(int(s) for s in doc["shape"])
        header = BlockHeader(
            key=key,
            meta=BlockMeta(parent, str(doc["retention"]), float(doc["expires_at"]), tenant),
            dtype=_parse_dtype(doc["dtype"]),
            shape=shape,
            layout=str(doc["layout"]),
            payload_len=int(doc["payload_len"]),
            payload_check=int(doc["payload_crc32" if version == 1 else "payload_xxh3"]),
            header_len=end + _CRC.size,
            version=version,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptBlockError(f"bad header fields: {exc}") from exc
    if file_len is not None and file_len != header.file_len:
        raise CorruptBlockError(f"file is {file_len} bytes, header says {header.file_len}")
    return header


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_block_file(
    final_path: str,
    tmp_path: str,
    header: bytes,
    payload: memoryview,
    *,
    fsync: bool = True,
    mtime: float | None = None,
) -> None:
    """Write ``header + payload`` crash-safely: tmp file -> fsync -> rename -> fsync dir.
    ``mtime`` (the block's expiry, see ``DiskTier.touch``) is set before the fsync."""
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, header)
        _write_all(fd, payload)
        if mtime is not None:
            os.utime(fd, (mtime, mtime))
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quiet(tmp_path)
        raise
    os.close(fd)
    try:
        os.replace(tmp_path, final_path)
    except BaseException:
        _unlink_quiet(tmp_path)
        raise
    if fsync:
        fsync_dir(os.path.dirname(final_path))


def read_header_file(path: str) -> BlockHeader:
    """Header-only read (used to rebuild the index on open); checks the file size too."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(min(size, 4096))
        if len(head) >= _PREFIX.size:
            meta_len = _PREFIX.unpack_from(head, 0)[2]
            need = _PREFIX.size + meta_len + _CRC.size
            if need > len(head) and meta_len <= _MAX_META:
                head += f.read(need - len(head))
    return decode_header(head, size)


def read_block_file(path: str) -> tuple[BlockHeader, torch.Tensor]:
    """Read a whole block file in one pass and check both checksums; returns the page."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    if got != size:
        raise CorruptBlockError("file changed size while reading")
    header = decode_header(view, size)
    payload = view[header.header_len :]
    if not header.payload_ok(payload):
        raise CorruptBlockError("payload checksum mismatch")
    flat = torch.frombuffer(
        buf, dtype=torch.uint8, offset=header.header_len, count=header.payload_len
    )
    try:
        page = flat.view(header.dtype).reshape(header.shape)
    except RuntimeError as exc:
        raise CorruptBlockError(f"payload does not fit {header.dtype} {header.shape}") from exc
    return header, page


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
