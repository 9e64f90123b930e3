"""The vectorised reopen (#20 item 7): segment headers encoded from a per-geometry template
equal the JSON encoding byte for byte; the location table over the manifest's rows behaves as
the ``key -> record`` dict it replaces (random operations against a dict); manifests written
from it, and a reopen after deletes, touches and compaction, keep exactly the live records;
array-form recovered columns load the same index as the list form."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from deepinfer_cache import BlockMeta, PrefixIndex, SegmentDiskTier
from deepinfer_cache.disk_format import CorruptBlockError
from deepinfer_cache.index_bulk import RecoveredColumns
from deepinfer_cache.meta import RecoveredBlock
from deepinfer_cache.recovery import rebuild_index
from deepinfer_cache.segment_format import (
    MANIFEST_DTYPE,
    SEGMENT_HEADER_BYTES,
    SEGMENT_MAGIC,
    Geometry,
    _encode_json_header,
    check_segment_header,
    encode_segment_header,
    slot_bytes_for,
)
from deepinfer_cache.tiers._locations import LocationTable

PAGE = (2, 3, 4)
NOW = 1_000_000.0


# ---------------------------------------------------------------------- segment headers
@pytest.mark.parametrize("shape", [(1,), (2, 3, 4), (2, 64, 64, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8])
def test_header_template_equals_the_json_encoding(shape, dtype) -> None:
    page = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    g = Geometry(dtype, shape, "page", page, slot_bytes_for(page))
    for seg in (0, 1, 9, 10, 255, 2**32, 2**63 - 1):
        doc = {**g.doc(), "segment": seg}
        ref = _encode_json_header(SEGMENT_MAGIC, doc, pad_to=SEGMENT_HEADER_BYTES)
        assert encode_segment_header(g, seg) == ref
        check_segment_header(ref, g, seg)
        with pytest.raises(CorruptBlockError):
            check_segment_header(ref, g, seg + 1)  # another segment's header


# ---------------------------------------------------------------------- location table
def _rec(rng: random.Random, k: int) -> tuple:
    return (
        rng.randrange(4),
        rng.randrange(64),
        rng.randbytes(16) if rng.random() < 0.8 else None,
        rng.randbytes(16) if rng.random() < 0.3 else None,
        rng.choice(["chat", "agent", "x"]),
        float(rng.randrange(10**6)),
        rng.randrange(2**63),
    )


def _rows(recs: dict[bytes, tuple], classes: list[str]) -> np.ndarray:
    rows = np.zeros(len(recs), dtype=MANIFEST_DTYPE)
    for i, (k, r) in enumerate(recs.items()):
        rows[i]["key"] = np.frombuffer(k, np.uint8)
        rows[i]["parent"] = np.frombuffer(r[2] or bytes(16), np.uint8)
        rows[i]["tenant"] = np.frombuffer(r[3] or bytes(16), np.uint8)
        rows[i]["flags"] = (r[2] is not None) | (r[3] is not None) << 1
        rows[i]["cls"] = classes.index(r[4])
        rows[i]["segment"], rows[i]["slot"] = r[0], r[1]
        rows[i]["expires"], rows[i]["xxh3"] = r[5], r[6]
    return rows


def _table(recs: dict[bytes, tuple]) -> LocationTable:
    classes = ["agent", "chat", "x", "unused"]
    return LocationTable(_rows(recs, classes), classes, {k: i for i, k in enumerate(recs)})


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(0, 40), ops=st.integers(0, 60))
def test_location_table_behaves_as_the_dict_it_replaces(seed: int, n: int, ops: int) -> None:
    rng = random.Random(seed)
    ref = {rng.randbytes(16): _rec(rng, i) for i in range(n)}
    table = _table(dict(ref))
    keys = list(ref) + [rng.randbytes(16) for _ in range(3)]
    for _ in range(ops):
        k = rng.choice(keys)
        op = rng.randrange(5)
        if op == 0:
            assert table.get(k) == ref.get(k)
            if k in ref:
                assert table.get(k) is table.get(k)  # the same object: ``is`` checks hold
        elif op == 1:
            ref[k] = table[k] = _rec(rng, 0)
        elif op == 2:
            assert table.pop(k) == ref.pop(k, None)
        elif op == 3:
            seg = rng.randrange(4)
            assert dict(table.in_segment(seg)) == {kk: r for kk, r in ref.items() if r[0] == seg}
        else:
            assert (k in table) == (k in ref)
        assert len(table) == len(ref) and set(table) == set(ref)
    live: dict[int, int] = {}
    for r in ref.values():
        live[r[0]] = live.get(r[0], 0) + 1
    assert table.live_per_segment() == live
    # A manifest written from the table lists exactly the live records.
    rows, classes = table.manifest_rows(table.snapshot())
    back = _table_from_rows(rows, classes)
    assert {k: back.get(k) for k in back} == ref


def _table_from_rows(rows: np.ndarray, classes: list[str]) -> LocationTable:
    keys = [r["key"].tobytes() for r in rows]
    return LocationTable(rows, classes, {k: i for i, k in enumerate(keys)})


# ---------------------------------------------------------------------- the tier
def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def page_of(i: int) -> torch.Tensor:
    return (torch.arange(24, dtype=torch.float32).reshape(PAGE) + 1000.0 * i).to(torch.bfloat16)


def meta(i: int) -> BlockMeta:
    tenant = b"t" * 16 if i == 0 else None
    return BlockMeta(key(i - 1) if i else None, "agent" if i % 3 else "chat", 2e9 + i, tenant)


def open_tier(path) -> SegmentDiskTier:
    return SegmentDiskTier(
        path, PAGE, torch.bfloat16, 1 << 24, segment_bytes=4 * 4096, compact_below=0.5
    )


def served(tier: SegmentDiskTier, ids) -> list[int]:
    out = []
    for i, page in zip(ids, tier.get_many([key(i) for i in ids])):
        if page is not None:
            assert torch.equal(page, page_of(i)), f"block {i} served wrong bytes"
            out.append(i)
    return out


def test_reopen_then_delete_touch_compact_and_reopen_keeps_exactly_the_live(tmp_path) -> None:
    tier = open_tier(tmp_path)
    for i in range(16):
        assert tier.put(key(i), page_of(i), meta(i), block=True)
    assert tier.flush()
    tier.close()
    tier = open_tier(tmp_path)  # everything now sits in the manifest's rows
    cols = tier.recovered_columns()
    assert sorted(cols.keys) == sorted(key(i) for i in range(16))
    by_key = dict(zip(cols.keys, zip(cols.parents, cols.retention, cols.expires, cols.tenants)))
    for i in range(16):
        m = meta(i)
        assert by_key[key(i)] == (m.parent, m.retention, m.expires_at, m.tenant)
    for i in (0, 1, 2, 5, 6):
        tier.delete(key(i))
    tier.touch(key(9), 3e9)
    assert tier.flush()
    tier.compact()
    keep = [3, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    assert served(tier, range(16)) == keep
    tier.close()
    tier = open_tier(tmp_path)
    assert served(tier, range(16)) == keep
    got = {b.key: b.meta for b in tier.recovered()}
    assert set(got) == {key(i) for i in keep}
    assert got[key(9)].expires_at == 3e9 and got[key(10)].expires_at == meta(10).expires_at
    tier.close()


# ---------------------------------------------------------------------- index columns
def _forest(seed: int, n: int) -> list[RecoveredBlock]:
    rng = random.Random(seed)
    keys = [rng.randbytes(15) + b"\x00" for _ in range(n)]  # trailing zero bytes kept
    out = []
    for i, k in enumerate(keys):
        parent = keys[rng.randrange(i)] if i and rng.random() < 0.8 else None
        if i and rng.random() < 0.05:
            parent = rng.randbytes(16)  # missing: an orphan
        exp = NOW + rng.choice([-5.0, 60.0, 600.0])
        tenant = rng.randbytes(15) + b"\x00" if parent is None else None
        out.append(
            RecoveredBlock(k, BlockMeta(parent, rng.choice(["chat", "odd"]), exp, tenant), exp)
        )
    return out


class _Tier:
    def __init__(self, blocks: list[RecoveredBlock], arrays: bool) -> None:
        self.blocks, self.arrays, self.deleted = blocks, arrays, []

    def recovered(self) -> list[RecoveredBlock]:
        return self.blocks

    def recovered_columns(self) -> RecoveredColumns:
        bs = self.blocks
        keys = [b.key for b in bs]
        if not self.arrays:
            return RecoveredColumns(
                keys,
                [b.meta.parent for b in bs],
                [b.meta.retention for b in bs],
                [b.mtime for b in bs],
                [b.meta.tenant for b in bs],
            )
        names = ["chat", "odd", "never-used"]
        s16 = lambda xs: np.frombuffer(b"".join(x or bytes(16) for x in xs), "S16")  # noqa: E731
        return RecoveredColumns(
            keys,
            key_array=s16(keys),
            parent_array=s16([b.meta.parent for b in bs]),
            has_parent=np.array([b.meta.parent is not None for b in bs], bool),
            tenant_array=s16([b.meta.tenant for b in bs]),
            has_tenant=np.array([b.meta.tenant is not None for b in bs], bool),
            retention_codes=np.array([names.index(b.meta.retention) for b in bs], np.uint16),
            retention_names=names,
            expires_array=np.array([b.mtime for b in bs]),
            key_pos={k: i for i, k in enumerate(keys)},
        )

    def delete(self, key: bytes) -> None:
        self.deleted.append(key)

    def __contains__(self, key: object) -> bool:
        return True


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(0, 60))
def test_array_columns_load_the_same_index_as_lists(seed: int, n: int) -> None:
    lists, arrays = _Tier(_forest(seed, n), False), _Tier(_forest(seed, n), True)
    a, b = PrefixIndex(num_tiers=2), PrefixIndex(num_tiers=2)
    ra, rb = rebuild_index(a, 1, lists, NOW), rebuild_index(b, 1, arrays, NOW)
    assert (ra.orphans, ra.expired, ra.tenants) == (rb.orphans, rb.expired, rb.tenants)
    assert (ra.unknown_blocks, ra.unknown_classes) == (rb.unknown_blocks, rb.unknown_classes)
    assert sorted(lists.deleted) == sorted(arrays.deleted)
    assert a.keys_in(1) == b.keys_in(1)
    for k in a.keys_in(1):
        assert (a.parent_of(k), a.expires_of(k), a.retention_of(k)) == (
            b.parent_of(k),
            b.expires_of(k),
            b.retention_of(k),
        )
    cols = arrays.recovered_columns()  # the lists, built on demand from the arrays
    ref = lists.recovered_columns()
    assert (cols.parents, cols.retention, cols.expires, cols.tenants) == (
        ref.parents,
        ref.retention,
        ref.expires,
        ref.tenants,
    )


# ---------------------------------------------------------------------- pieced reads
@pytest.mark.parametrize("damage", ["none", "flip_last_piece", "flip_header", "truncate"])
def test_large_records_read_in_pieces_are_checked_whole(tmp_path, monkeypatch, damage) -> None:
    """A record larger than a piece is read and hashed piece by piece (monkeypatched to
    16-byte pieces, so a 48-byte page takes three): a flip in any piece, in the header, or a
    file that ends mid-payload is a miss, never a wrong page."""
    import deepinfer_cache.tiers.segment_read as sr

    monkeypatch.setattr(sr, "_HOT_BYTES", 1)  # one record per read
    monkeypatch.setattr(sr, "_PIECE_BYTES", 16)
    tier = open_tier(tmp_path)
    for i in range(3):
        assert tier.put(key(i), page_of(i), meta(i), block=True)
    assert tier.flush()
    path, off = tier.location_of(key(1))
    tier.close()
    if damage != "none":
        with open(path, "r+b") as f:
            if damage == "truncate":
                f.truncate(off + 128 + 40)  # ends in the payload's last piece
            else:
                at = off + (128 + 47 if damage == "flip_last_piece" else 20)
                f.seek(at)
                b = f.read(1)
                f.seek(at)
                f.write(bytes([b[0] ^ 0x10]))
    tier = open_tier(tmp_path)
    got = served(tier, range(3))
    if damage == "none":
        assert got == [0, 1, 2]
    elif damage == "truncate":
        assert got == [0]  # block 2 sat after the cut
    else:
        assert got == [0, 2]
        assert tier.counters.corrupt_quarantined == 1
    tier.close()
