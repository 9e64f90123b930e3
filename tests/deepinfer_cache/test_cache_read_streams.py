"""SegmentDiskTier's read streams: adjacent runs read in order through a stream's own open file
description (kept idle for the next stream) return the same blocks as through the shared
descriptor, and no description outlives a retired segment or the tier."""

from __future__ import annotations

import os

import pytest
import torch
from _segment_tier_helpers import PAGE, fill, key, open_tier, page_of

from deepinfer_cache.tiers import segment_read_requests


def open_paths() -> list[str]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue
    return out


@pytest.mark.parametrize("own", [True, False])
def test_streams_read_the_same_blocks_with_or_without_own_descriptors(tmp_path, own) -> None:
    tier = open_tier(tmp_path / "c", max_read_bytes=3 * 4096)  # runs of 3: several per stream
    tier._own_readahead = own
    fill(tier, range(30))  # four segments of 8 slots
    ids = [*range(30), 5, 99, 29, 0]
    got = tier.get_many([key(i) for i in ids])
    for i, p in zip(ids, got):
        assert (p is None) if i == 99 else torch.equal(p, page_of(i))
    out = torch.empty((len(ids), *PAGE), dtype=torch.bfloat16)
    ok = tier.get_many_into([key(i) for i in ids], out)
    assert ok == [i != 99 for i in ids]
    assert all(torch.equal(out[j], page_of(i)) for j, i in enumerate(ids) if i != 99)
    futs = tier.get_many_async([key(i) for i in ids])
    assert [f.result() is not None for f in futs] == [i != 99 for i in ids]
    spare = sum(len(s.spare) for s in tier._segments.values())
    assert (spare > 0) == own  # kept for the next stream only when streams have their own
    tier.close()


def test_a_long_request_is_split_into_streams(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(segment_read_requests, "_STREAM_BYTES", 5 * 4096)
    tier = open_tier(tmp_path / "c", max_read_bytes=2 * 4096, segment_bytes=64 * 4096)
    fill(tier, range(12))
    streams = tier._streams([key(i) for i in range(12)])
    assert [[len(run) for run in st] for st in streams] == [[2, 2], [2, 2], [2, 2]]
    assert all(
        torch.equal(p, page_of(i)) for i, p in enumerate(tier.get_many([key(i) for i in range(12)]))
    )
    tier.close()


def test_no_description_outlives_a_retired_segment_or_the_tier(tmp_path) -> None:
    tier = open_tier(tmp_path / "c")
    fill(tier, range(16))  # segments 0 and 1
    seg0 = tier._segments[0]
    for _ in range(3):  # streams leave idle descriptions behind
        assert all(p is not None for p in tier.get_many([key(i) for i in range(8)]))
    assert seg0.spare and all(os.readlink(f"/proc/self/fd/{fd}") == seg0.path for fd in seg0.spare)
    for i in range(8):
        tier.delete(key(i))
    fill(tier, [16])
    tier.compact()
    assert 0 not in tier._segments and not seg0.spare
    assert not [p for p in open_paths() if p.startswith(seg0.path)]  # its file can be freed
    assert all(
        torch.equal(p, page_of(i))
        for i, p in zip(range(8, 16), tier.get_many([key(i) for i in range(8, 16)]))
    )
    tier.close()
    segdir = str(tmp_path / "c" / "segments")
    assert not [p for p in open_paths() if p.startswith(segdir)]


@pytest.mark.parametrize("whole", [True, False])
def test_a_stream_is_one_read_call_or_one_per_run_with_the_same_pages(
    tmp_path, monkeypatch, whole
) -> None:
    tier = open_tier(tmp_path / "c", max_read_bytes=2 * 4096)  # runs of 2 slots
    tier._whole_streams = whole
    fill(tier, range(16))  # two segments of 8 slots: two streams of four runs each
    calls: list[int] = []
    real = tier._read_run

    def counted(keys, dest=None, fds=None):
        calls.append(len(keys))
        return real(keys, dest, fds)

    monkeypatch.setattr(tier, "_read_run", counted)
    ids = [*range(16), 99]
    got = tier.get_many([key(i) for i in ids])
    assert got[-1] is None
    assert all(torch.equal(p, page_of(i)) for i, p in zip(ids[:-1], got[:-1]))
    runs = sorted(calls)
    assert runs == ([1, 8, 8] if whole else [1, *[2] * 8])  # 99: a run of its own
    out = torch.empty((len(ids), *PAGE), dtype=torch.bfloat16)
    assert tier.get_many_into([key(i) for i in ids], out) == [i != 99 for i in ids]
    assert all(torch.equal(out[j], page_of(i)) for j, i in enumerate(ids[:-1]))
    tier.close()


def test_a_whole_stream_whose_slots_moved_is_read_key_by_key(tmp_path, monkeypatch) -> None:
    tier = open_tier(tmp_path / "c", max_read_bytes=2 * 4096)
    fill(tier, range(8))
    keys = [key(i) for i in range(8)]
    streams = tier._streams(keys)
    tier.delete(key(3))  # after the streams were planned: the stream is no longer consecutive
    monkeypatch.setattr(tier, "_streams", lambda _keys: streams)
    got = tier.get_many(keys)
    assert got[3] is None
    assert all(torch.equal(got[i], page_of(i)) for i in range(8) if i != 3)
    tier.close()
