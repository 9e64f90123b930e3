"""DiskTier: format, corruption -> miss + quarantine, lock file, capacity, write errors."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
import torch

from deepinfer_cache import BlockMeta, CacheLockedError, DiskTier
from deepinfer_cache import disk_format as fmt

PAGE = (2, 3, 4)


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def meta(parent: int | None = None) -> BlockMeta:
    return BlockMeta(key(parent) if parent is not None else None, "chat", 2e9)


def open_tier(path, **kw) -> DiskTier:
    kw.setdefault("capacity_bytes", 1 << 20)
    return DiskTier(path, PAGE, torch.bfloat16, **kw)


def filled(tmp_path, n: int = 3) -> tuple[list[torch.Tensor], list[str]]:
    tier = open_tier(tmp_path)
    pages = [torch.randn(PAGE).to(torch.bfloat16) for _ in range(n)]
    for i, p in enumerate(pages):
        assert tier.put(key(i), p, meta(i - 1 if i else None))
    assert tier.flush()
    paths = [tier.path_of(key(i)) for i in range(n)]
    tier.close()
    return pages, paths


def test_round_trip_and_recovery(tmp_path) -> None:
    pages, paths = filled(tmp_path)
    tier = open_tier(tmp_path)
    rec = {b.key: b.meta for b in tier.recovered()}
    assert rec[key(1)] == meta(0) and rec[key(0)] == meta(None)
    for i, p in enumerate(pages):
        assert torch.equal(tier.get(key(i)), p)
    header = fmt.read_header_file(paths[0])
    assert (header.dtype, header.shape, header.layout) == (torch.bfloat16, PAGE, "page")
    assert os.path.getsize(paths[0]) == header.file_len
    assert not os.listdir(tmp_path / "tmp")
    tier.close()


def flip(path: str, offset_from_end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, os.SEEK_END)
        b = f.read(1)
        f.seek(-offset_from_end, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))


def test_flipped_payload_byte_is_a_miss_and_quarantined(tmp_path) -> None:
    _pages, paths = filled(tmp_path)
    flip(paths[1], 3)
    tier = open_tier(tmp_path)  # header is fine, so the block is indexed...
    assert key(1) in tier
    assert tier.get(key(1)) is None  # ...but never served
    assert key(1) not in tier and tier.counters.corrupt_quarantined == 1
    assert tier.pop_failed() == [key(1)]
    assert len(os.listdir(tmp_path / "quarantine")) == 1 and not os.path.exists(paths[1])
    tier.close()


@pytest.mark.parametrize("damage", ["truncate", "magic", "version", "header_byte", "rename"])
def test_bad_files_are_quarantined_on_open(tmp_path, damage: str) -> None:
    _pages, paths = filled(tmp_path)
    p = paths[2]
    if damage == "truncate":
        os.truncate(p, os.path.getsize(p) - 5)
    elif damage == "magic":
        with open(p, "r+b") as f:
            f.write(b"XXXX")
    elif damage == "version":
        with open(p, "r+b") as f:
            f.seek(8)
            f.write((99).to_bytes(2, "little"))
    elif damage == "header_byte":
        with open(p, "r+b") as f:
            f.seek(20)
            b = f.read(1)
            f.seek(20)
            f.write(bytes([b[0] ^ 1]))
    else:  # a valid file under another block's name
        os.replace(p, p[:-1] + ("0" if p[-1] != "0" else "1"))
    tier = open_tier(tmp_path)
    assert key(2) not in tier and tier.get(key(2)) is None
    assert tier.counters.corrupt_quarantined == 1
    assert {b.key for b in tier.recovered()} == {key(0), key(1)}
    tier.close()


def test_wrong_page_layout_is_quarantined(tmp_path) -> None:
    filled(tmp_path, 1)
    tier = DiskTier(tmp_path, (2, 3, 5), torch.bfloat16, 1 << 20)
    assert len(tier) == 0 and tier.counters.corrupt_quarantined == 1
    tier.close()


def test_leftover_tmp_files_are_removed(tmp_path) -> None:
    filled(tmp_path, 1)
    (tmp_path / "tmp" / "junk.1").write_bytes(b"partial")
    tier = open_tier(tmp_path)
    assert tier.counters.tmp_files_removed == 1 and len(tier) == 1
    tier.close()


def test_lock_file_stops_a_second_writer(tmp_path) -> None:
    tier = open_tier(tmp_path)
    with pytest.raises(CacheLockedError, match="locked"):
        open_tier(tmp_path)
    code = (
        "import sys, torch; from deepinfer_cache import DiskTier, CacheLockedError\n"
        "try:\n    DiskTier(sys.argv[1], (2,), torch.float32, 1024)\n"
        "except CacheLockedError:\n    sys.exit(3)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True)
    assert r.returncode == 3, r.stderr
    tier.close()
    open_tier(tmp_path).close()  # released on close


def test_capacity_limit_is_exact(tmp_path) -> None:
    one = 2 * 3 * 4 * 2 + fmt.max_header_len(PAGE, torch.bfloat16, "page")
    tier = open_tier(tmp_path, capacity_bytes=2 * one + one // 2)
    assert tier.file_bytes == one
    p = torch.zeros(PAGE, dtype=torch.bfloat16)
    assert tier.put(key(0), p, meta()) and tier.put(key(1), p, meta(0))
    assert not tier.has_room() and not tier.put(key(2), p, meta(1))
    tier.flush()
    assert (
        tier.used_bytes() == 2 * one == sum(os.path.getsize(tier.path_of(key(i))) for i in range(2))
    )
    tier.delete(key(1))
    assert tier.put(key(2), p, meta(1))
    tier.close()


def test_write_error_skips_and_keeps_durable_blocks(tmp_path, monkeypatch) -> None:
    tier = open_tier(tmp_path)
    good = torch.ones(PAGE, dtype=torch.bfloat16)
    tier.put(key(0), good, meta())
    tier.flush()

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("deepinfer_cache.tiers.disk.write_block_file", disk_full)
    assert tier.put(key(1), good, meta(0))  # queued...
    tier.flush()
    assert key(1) not in tier and tier.counters.write_errors == 1  # ...then skipped, counted
    assert tier.pop_failed() == [key(1)]
    assert torch.equal(tier.get(key(0)), good)
    tier.close()


def test_pending_page_is_private_copy(tmp_path) -> None:
    tier = open_tier(tmp_path)
    p = torch.ones(PAGE, dtype=torch.bfloat16)
    tier.put(key(0), p, meta())
    p.zero_()  # the caller may reuse its buffer at once
    tier.flush()
    assert torch.equal(tier.get(key(0)), torch.ones(PAGE, dtype=torch.bfloat16))
    tier.close()


def test_decode_header_rejects_garbage() -> None:
    with pytest.raises(fmt.CorruptBlockError):
        fmt.decode_header(b"short")
    with pytest.raises(fmt.CorruptBlockError, match="magic"):
        fmt.decode_header(b"\x00" * 64)
