"""The C run reader (``native_read.py``, #20 item 7) against a Python reference, and the
segment tier's reads through it against its pure-Python loop: same pages, a corrupt or
truncated record is a miss (never a reused buffer's old bytes), in every position."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import xxhash
from _segment_tier_helpers import fill, key, open_tier, page_of
from hypothesis import HealthCheck, given, settings

from deepinfer_cache import BlockMeta, SegmentDiskTier, native_read
from deepinfer_cache.disk_format import CorruptBlockError
from deepinfer_cache.native_hash import NativeHashUnavailable
from deepinfer_cache.native_read import RecordReader, load_record_reader
from deepinfer_cache.segment_format import (
    RECORD_HEADER_BYTES,
    Geometry,
    check_record_parts,
    encode_record_header,
)
from deepinfer_cache.segment_run_check import check_run_heads
from deepinfer_cache.tiers import segment_read

_GEOMETRY = Geometry(torch.uint8, (64,), "test", 64, 4096)


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> RecordReader:
    try:
        return load_record_reader(tmp_path_factory.mktemp("native"))
    except NativeHashUnavailable as exc:  # no compiler here: the Python loop is all there is
        pytest.skip(f"no native reader: {exc}")


def _read(
    reader: RecordReader,
    fd: int,
    offset: int,
    n: int,
    slot: int,
    head: int,
    page: int,
    piece: int,
    hot: int,
    overlap: bool | int = True,
):
    pages = [np.full(page, 0xEE, dtype=np.uint8) for _ in range(n)]
    heads = np.zeros(n * head, dtype=np.uint8)
    done, digests, error = reader(
        fd,
        offset,
        slot,
        head,
        [p.__array_interface__["data"][0] for p in pages],
        page,
        heads,
        piece,
        hot,
        overlap,
    )
    return pages, heads, done, digests, error


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 7),
    head=st.sampled_from([1, 16, 128]),
    page=st.integers(1, 5000),
    pad=st.sampled_from([0, 1, 300, 4096]),
    piece=st.sampled_from([1, 7, 256, 1024, 1 << 18]),
    hot=st.sampled_from([1, 100, 4096, 1 << 20]),
    offset=st.sampled_from([0, 3, 4096]),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
    seed=st.integers(0, 2**32 - 1),
    overlap=st.sampled_from([0, 1, 2, 4]),  # reading threads
)
def test_reads_and_digests_equal_a_python_reference(
    reader: RecordReader, tmp_path: Path, n, head, page, pad, piece, hot, offset, cut, seed, overlap
) -> None:
    slot = head + page + pad
    size = offset + n * slot
    if cut is not None:  # the file ends somewhere inside the run
        size = offset + cut % (n * slot + 1)
    data = np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)
    path = tmp_path / f"run-{seed}-{n}-{page}.bin"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        pages, heads, done, digests, error = _read(
            reader, fd, offset, n, slot, head, page, piece, hot, overlap
        )
    finally:
        os.close(fd)
        path.unlink()
    assert error is None
    for i in range(n):
        at = offset + i * slot
        whole = at + head + page <= size
        assert done[i] == whole, (i, size)
        if whole:
            body = data[at + head : at + head + page]
            assert digests[i] == xxhash.xxh3_64_intdigest(body.tobytes())
            assert np.array_equal(pages[i], body)
            assert np.array_equal(heads[i * head : (i + 1) * head], data[at : at + head])


def test_a_failed_read_is_reported_and_nothing_is_done(
    reader: RecordReader, tmp_path: Path
) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)  # a directory: preadv fails with EISDIR
    try:
        _, _, done, _, error = _read(reader, fd, 0, 3, 4096, 128, 1000, 256, 4096)
    finally:
        os.close(fd)
    assert isinstance(error, OSError) and error.errno is not None
    assert done == [False, False, False]


def test_bad_arguments_are_refused(reader: RecordReader) -> None:
    with pytest.raises(ValueError, match="heads"):
        reader(0, 0, 4096, 128, [1, 2], 1000, np.zeros(128, dtype=np.uint8), 256, 4096)
    with pytest.raises(ValueError, match="unusable"):  # slot smaller than header + page
        reader(0, 0, 100, 128, [1], 1000, np.zeros(128, dtype=np.uint8), 256, 4096)


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    native_read.record_reader.cache_clear()
    try:
        monkeypatch.setenv("DEEPINFER_CACHE_NATIVE", "0")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # switched off on purpose: no warning
            assert native_read.record_reader() is None
    finally:
        native_read.record_reader.cache_clear()


# ------------------------------------------------------------------ the tier, both paths
BIG = (2, 16, 1024)  # 64 KiB of bf16: read in several pieces once pieces are made small


def _big_page(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    return torch.randn(BIG, generator=g).to(torch.bfloat16)


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))


@pytest.mark.parametrize("native", [True, False])
def test_the_tier_serves_the_same_pages_either_way(tmp_path: Path, native: bool) -> None:
    tier = open_tier(tmp_path / "t", segment_bytes=64 * 4096)
    if native and native_read.record_reader() is None:
        pytest.skip("no native reader here")
    tier._native_read = native
    fill(tier, range(40))
    got = tier.get_many([key(i) for i in (*range(40), 99)])
    assert got[-1] is None
    assert all(g is not None and torch.equal(g, page_of(i)) for i, g in enumerate(got[:-1]))
    assert tier.counters.blocks_read == 40
    tier.close()


@pytest.mark.parametrize("direct", [True, False])
def test_pool_reads_go_direct_and_a_short_direct_read_is_read_again_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    if native_read.record_reader() is None:
        pytest.skip("no native reader here")
    calls: list[tuple[bool, list[bool]]] = []
    real = RecordReader.__call__

    def counted(self, *args, **kw):  # type: ignore[no-untyped-def]
        got = real(self, *args, **kw)
        calls.append((bool(args[10]) if len(args) > 10 else bool(kw.get("direct")), got[0]))
        return got

    monkeypatch.setattr(RecordReader, "__call__", counted)
    tier = open_tier(tmp_path / "t", segment_bytes=64 * 4096)
    tier._direct_reads = direct
    fill(tier, range(6))  # one segment; its file ends inside the last slot
    got = tier.get_many([key(i) for i in range(6)])
    assert all(g is not None and torch.equal(g, page_of(i)) for i, g in enumerate(got))
    kinds = [d for d, _ in calls]
    if direct and any(kinds):  # O_DIRECT where the file system takes it: one direct read,
        # whole although the file ends inside the last slot (the read stops at the end)
        assert calls == [(True, [True] * 6)]
    else:
        assert kinds == [False]
    # A file cut inside the last payload: the direct read comes up short, the run is read
    # again buffered (which comes up short too): the last block is a miss, the others served.
    path, off = tier.location_of(key(5))
    os.truncate(path, off + RECORD_HEADER_BYTES + 10)
    calls.clear()
    got = tier.get_many([key(i) for i in range(6)])
    assert got[5] is None and all(torch.equal(got[i], page_of(i)) for i in range(5))
    if direct and any(kinds):
        assert [d for d, _ in calls] == [True, False]
        assert calls[0][1] == calls[1][1] == [True] * 5 + [False]
    out = torch.empty((3, 2, 3, 4), dtype=torch.bfloat16)
    calls.clear()
    assert tier.get_many_into([key(i) for i in range(3)], out) == [True] * 3
    assert [d for d, _ in calls] == [False]  # the caller's rows: never direct
    tier.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    native=st.booleans(),
    count=st.integers(1, 9),
    bad=st.data(),
    where=st.sampled_from(["header", "payload start", "payload middle", "payload end", "truncate"]),
    piece=st.sampled_from([4096, 1 << 18]),
    overlap=st.booleans(),
    readers=st.sampled_from([0, 1, 2]),
    whole=st.booleans(),
    direct=st.sampled_from(["off", "one batch", "a batch per slot"]),
)
def test_a_damaged_record_is_a_miss_in_any_position(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    native,
    count,
    bad,
    where,
    piece,
    overlap,
    readers,
    whole,
    direct,
) -> None:
    if native and native_read.record_reader() is None:
        native = False
    monkeypatch.setattr(segment_read, "_PIECE_BYTES", piece)  # 64 KiB pages: 16 pieces or 1
    path = tmp_path_factory.mktemp("dmg")
    page_bytes = 2 * 16 * 1024 * 2
    tier = SegmentDiskTier(
        path,
        BIG,
        torch.bfloat16,
        1 << 24,
        segment_bytes=64 * (page_bytes + 4096),
        read_pool_bytes=1 << 22,
        max_read_bytes=2 * (page_bytes + 4096),  # runs of 2: a request is a stream of runs
    )
    tier._native_read = native
    tier._read_overlap = overlap
    tier._whole_streams = whole  # the stream read by one call, or run by run
    tier._direct_reads = direct != "off"
    tier._direct_readers = readers
    if direct == "a batch per slot":  # several direct reads a run: the reading thread's path
        monkeypatch.setattr(segment_read, "_DIRECT_BATCH_BYTES", page_bytes)
    for i in range(count):
        assert tier.put(key(i), _big_page(i), BlockMeta(None, "chat", 4e9), block=True)
    assert tier.flush()
    # Fill the pool with buffers that held other blocks' bytes.
    for _ in range(2):
        assert all(g is not None for g in tier.get_many([key(i) for i in range(count)]))
    j = bad.draw(st.integers(0, count - 1))
    seg, off = tier.location_of(key(j))
    if where == "truncate":
        if j != count - 1:
            j = count - 1
            seg, off = tier.location_of(key(j))
        os.truncate(seg, off + RECORD_HEADER_BYTES + page_bytes // 2)
    else:
        at = {
            "header": 40,
            "payload start": RECORD_HEADER_BYTES,
            "payload middle": RECORD_HEADER_BYTES + page_bytes // 2 + 3,
            "payload end": RECORD_HEADER_BYTES + page_bytes - 1,
        }[where]
        _flip(seg, off + at)
    got = tier.get_many([key(i) for i in range(count)])
    assert got[j] is None  # a miss: never the damaged bytes nor a reused buffer's old ones
    for i, g in enumerate(got):
        if i != j:
            assert g is not None and torch.equal(g, _big_page(i))
    assert tier.get(key(j)) is None  # forgotten: it stays a miss
    tier.close()


# ------------------------------------------------------------------ headers checked in one pass
def _heads_of(n: int, seed: int, page_bytes: int) -> tuple[bytearray, list[bytes], list[int]]:
    rng = np.random.default_rng(seed)
    keys = [rng.bytes(16) for _ in range(n)]
    digests = [int(rng.integers(0, 2**63)) for _ in range(n)]
    heads = bytearray()
    for j in range(n):
        meta = BlockMeta(rng.bytes(16) if j % 2 else None, "chat" if j % 3 else "agent", 4e9)
        heads += encode_record_header(keys[j], meta, page_bytes, digests[j], 7, 40 + j)
    return heads, keys, digests


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    damage=st.lists(
        st.tuples(st.integers(0, 11), st.integers(0, RECORD_HEADER_BYTES - 1), st.integers(1, 255)),
        max_size=4,
    ),
    wrong_digest=st.one_of(st.none(), st.integers(0, 11)),
)
def test_one_pass_header_check_agrees_with_the_per_record_check(
    n, seed, damage, wrong_digest
) -> None:
    page_bytes = 64
    heads, keys, digests = _heads_of(n, seed, page_bytes)
    for j, at, x in damage:  # flip bits anywhere in any header (magic, fields, CRC, padding)
        if j < n:
            heads[j * RECORD_HEADER_BYTES + at] ^= x
    if wrong_digest is not None and wrong_digest < n:
        digests[wrong_digest] ^= 1
    got = check_run_heads(
        heads, page_bytes=page_bytes, segment=7, first_slot=40, keys=keys, digests=digests
    )
    for j in range(n):
        head = memoryview(heads)[j * RECORD_HEADER_BYTES : (j + 1) * RECORD_HEADER_BYTES]
        try:
            check_record_parts(head, bytes(page_bytes), _GEOMETRY, 7, 40 + j, keys[j], digests[j])
            want = True
        except CorruptBlockError:
            want = False
        assert got[j] == want, (j, damage)
    if not damage and wrong_digest is None:
        assert all(got)


def test_one_pass_header_check_names_what_it_needs() -> None:
    heads, keys, digests = _heads_of(2, 1, 64)
    with pytest.raises(ValueError, match="digests"):
        check_run_heads(heads, page_bytes=64, segment=7, first_slot=40, keys=keys, digests=[1])
    assert not any(
        check_run_heads(heads, page_bytes=64, segment=7, first_slot=41, keys=keys, digests=digests)
    )  # each record names its own slot
    assert (
        check_run_heads(heads, page_bytes=64, segment=7, first_slot=40, keys=[], digests=[]) == []
    )
