"""Disk format version 2 (XXH3-64 payload check) reads version 1 files (CRC32) as well."""

from __future__ import annotations

import json
import os
import zlib

import torch
from _cache_helpers import BS, PAGE, page_for

from deepinfer_cache import DiskTier, TieredKVStore, hash_token_blocks
from deepinfer_cache import disk_format as fmt


def write_v1(path: str, key: bytes, parent: bytes | None, page: torch.Tensor) -> None:
    payload = page.contiguous().view(torch.uint8).numpy().tobytes()
    doc = {
        "hash": key.hex(),
        "parent": parent.hex() if parent else None,
        "dtype": "float32",
        "shape": list(page.shape),
        "layout": "page",
        "retention": "chat",
        "expires_at": 4e9,
        "payload_len": len(payload),
        "payload_crc32": zlib.crc32(payload),
    }
    body = json.dumps(doc).encode()
    head = fmt._PREFIX.pack(fmt.MAGIC, 1, len(body)) + body
    with open(path, "wb") as f:
        f.write(head + fmt._CRC.pack(zlib.crc32(head)) + payload)


def test_version_1_files_are_still_served(tmp_path) -> None:
    tokens = list(range(2 * BS))
    hs = hash_token_blocks(tokens, BS)
    disk = DiskTier(tmp_path, PAGE, torch.float32, 1 << 20)
    paths = [disk.path_of(h) for h in hs]
    disk.close()
    for i, h in enumerate(hs):
        write_v1(paths[i], h, hs[i - 1] if i else None, page_for(h))
    with TieredKVStore([DiskTier(tmp_path, PAGE, torch.float32, 1 << 20)], BS) as store:
        res = store.fetch(tokens).result()
        assert res.num_blocks == 2
        assert all(torch.equal(p, page_for(h)) for p, h in zip(res.pages, hs))
    # A damaged version 1 payload fails its CRC32 like before.
    with open(paths[1], "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    with TieredKVStore([DiskTier(tmp_path, PAGE, torch.float32, 1 << 20)], BS) as store:
        assert store.fetch(tokens).result().num_blocks == 1


def test_new_files_are_version_2_with_an_xxh3_check(tmp_path) -> None:
    tokens = list(range(BS))
    with TieredKVStore([DiskTier(tmp_path, PAGE, torch.float32, 1 << 20)], BS) as store:
        store.store(tokens, page_for(hash_token_blocks(tokens, BS)[0])[None])
        path = store.tiers[0].path_of(hash_token_blocks(tokens, BS)[0])  # type: ignore[attr-defined]
    header = fmt.read_header_file(path)
    assert header.version == 2 == fmt.FORMAT_VERSION
    with open(path, "rb") as f:
        assert header.payload_ok(f.read()[header.header_len :])
