"""Reopen of a SegmentDiskTier holding 1M blocks (#20 item 7 target: <= 5 s), and the
block-by-block rebuild it replaces, measured in the same process.

    .venv/bin/python benchmarks/bench_cache_reopen.py [--blocks 1000000] [--dir /path/on/ssd]
        [--ab REV] [--rounds 3]

``--ab REV`` also reopens the same directory with the package as it was at git revision REV
(``git archive``, imported as ``deepinfer_cache_ab``), alternating old and new in ``--rounds``
rounds in this one process, and prints the old/new ratio of the process CPU per reopen (tier +
index) as a range: on a loaded machine the wall clock of one reopen says little.

The directory is synthesised with the tier's own format code: a manifest listing every block
(chains of 1203 blocks, a 77k-token prompt at block size 64) and sparse segment files of the
real geometry (2 MiB bf16 pages, 256 MiB segments) whose headers are real and whose slots
were never written. A reopen reads the manifest and each segment's header, not the slots, so
the sparse files cost what real ones would. Timed: ``SegmentDiskTier(...)`` (manifest read,
checks, location table) and ``TieredKVStore([tier])`` (the index rebuilt from it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

from deepinfer_cache import PrefixIndex, SegmentDiskTier, TieredKVStore
from deepinfer_cache.meta import BlockMeta, RecoveredBlock
from deepinfer_cache.recovery import rebuild_index
from deepinfer_cache.segment_format import (
    MANIFEST_DTYPE,
    Geometry,
    Manifest,
    encode_manifest,
    encode_segment_header,
    segment_name,
    slot_bytes_for,
    slot_offset,
    write_manifest_file,
)

PAGE = (2, 64, 64, 128)  # bf16: 2 MiB per block
CHAIN = 1203


def synthesise(directory: str, n: int) -> None:
    page_bytes = 2 * 64 * 64 * 128 * 2
    geom = Geometry(torch.bfloat16, PAGE, "page", page_bytes, slot_bytes_for(page_bytes))
    per_seg = (256 << 20) // geom.slot_bytes
    rng = np.random.default_rng(0)
    rows = np.zeros(n, dtype=MANIFEST_DTYPE)
    rows["key"] = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    pos = np.arange(n)
    first = pos % CHAIN == 0
    rows["parent"][~first] = rows["key"][:-1][~first[1:]]
    rows["flags"] = np.where(first, 2, 1)
    rows["tenant"][first] = 7
    rows["cls"] = (pos // CHAIN) % 2
    rows["segment"] = pos // per_seg
    rows["slot"] = pos % per_seg
    rows["expires"] = time.time() + 86400 + (pos // CHAIN) * 10.0
    rows["xxh3"] = rng.integers(0, 2**63, size=n)
    nseg = int(rows["segment"].max()) + 1
    segdir = os.path.join(directory, "segments")
    for d in ("segments", "tmp", "quarantine"):
        os.makedirs(os.path.join(directory, d), exist_ok=True)
    covered = {}
    for s in range(nseg):
        slots = min(per_seg, n - s * per_seg)
        covered[s] = slots
        with open(os.path.join(segdir, segment_name(s)), "wb") as f:
            f.write(encode_segment_header(geom, s))
            f.truncate(slot_offset(slots, geom.slot_bytes))
    head, body = encode_manifest(geom, Manifest(nseg, covered, ["agent", "chat"], rows))
    write_manifest_file(
        os.path.join(directory, "manifest"), os.path.join(directory, "tmp", "m"), head, body, True
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--compare", type=int, default=100_000, help="blocks for the old-path ratio")
    ap.add_argument("--ab", metavar="REV", help="also reopen with the package at git REV")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds for --ab")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="bench_reopen_", dir=args.dir)
    try:
        d = os.path.join(base, "cache")
        t0 = time.perf_counter()
        synthesise(d, args.blocks)
        print(f"synthesised {args.blocks:,} blocks in {time.perf_counter() - t0:.1f} s")
        for rep in range(2):
            t0, c0 = time.perf_counter(), time.process_time()
            tier = SegmentDiskTier(d, PAGE, torch.bfloat16, 1 << 62)
            t_tier, c_tier = time.perf_counter() - t0, time.process_time() - c0
            t0, c0 = time.perf_counter(), time.process_time()
            store = TieredKVStore([tier], block_size=64, persist_on_close=False)
            t_index, c_index = time.perf_counter() - t0, time.process_time() - c0
            assert len(store.index) == args.blocks, len(store.index)
            print(
                f"reopen {args.blocks:,} blocks (run {rep + 1}): tier {t_tier:.2f} s wall "
                f"({c_tier:.2f} s CPU) + index {t_index:.2f} s wall ({c_index:.2f} s CPU) = "
                f"{t_tier + t_index:.2f} s"
            )
            store.close()
        if args.ab:
            _ab(args.ab, d, args.blocks, args.rounds)
        # Same-process ratio against the block-by-block rebuild (the DiskTier path).
        m = min(args.compare, args.blocks)
        tier = SegmentDiskTier(d, PAGE, torch.bfloat16, 1 << 62)
        cols = tier.recovered_columns()
        blocks = [
            RecoveredBlock(k, BlockMeta(p, r, e, t), e)
            for k, p, r, e, t in zip(
                cols.keys[:m],
                cols.parents[:m],
                cols.retention[:m],
                cols.expires[:m],
                cols.tenants[:m],
            )
        ]
        tier.close()

        class Slow:
            def recovered(self):
                return blocks

            def delete(self, key):
                pass

            def __contains__(self, key):
                return True

        class Fast(Slow):
            def recovered_columns(self):
                return type(cols)(
                    cols.keys[:m],
                    cols.parents[:m],
                    cols.retention[:m],
                    cols.expires[:m],
                    cols.tenants[:m],
                )

        now = time.time()
        t0 = time.perf_counter()
        rebuild_index(PrefixIndex(num_tiers=1), 0, Slow(), now)
        t_slow = time.perf_counter() - t0
        t0 = time.perf_counter()
        rebuild_index(PrefixIndex(num_tiers=1), 0, Fast(), now)
        t_fast = time.perf_counter() - t0
        print(
            f"index rebuild of {m:,} blocks: block by block {t_slow:.2f} s, column-wise "
            f"{t_fast:.2f} s ({t_slow / t_fast:.1f}x)"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _reopen(pkg, d: str, n: int) -> tuple[float, float]:
    """(wall, process CPU) of one reopen (tier + index) with package ``pkg``."""
    t0, c0 = time.perf_counter(), time.process_time()
    tier = pkg.SegmentDiskTier(d, PAGE, torch.bfloat16, 1 << 62)
    store = pkg.TieredKVStore([tier], block_size=64, persist_on_close=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert len(store.index) == n, len(store.index)
    store.close()
    return wall, cpu


def _ab(rev: str, d: str, n: int, rounds: int) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_cache_index import _baseline_package

    import deepinfer_cache as new_pkg

    old_pkg = _baseline_package(rev)
    got: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    for _ in range(rounds):
        for label, pkg in (("old", old_pkg), ("new", new_pkg)):
            got[label].append(_reopen(pkg, d, n))
    ratios = [o[1] / w[1] for o, w in zip(got["old"], got["new"])]

    def span(label: str, i: int) -> str:
        xs = [x[i] for x in got[label]]
        return f"{min(xs):.2f}-{max(xs):.2f} s"

    print(
        f"A/B reopen of {n:,} blocks, {rounds} alternated rounds: {rev} {span('old', 1)} CPU "
        f"({span('old', 0)} wall), now {span('new', 1)} CPU ({span('new', 0)} wall); "
        f"old/new CPU per round {min(ratios):.2f}-{max(ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
