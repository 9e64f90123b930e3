"""Where ``SegmentDiskTier.get_many_into`` (reads into a reused staging buffer) spends its CPU,
against raw reads of the same bytes, alternated in rounds in one process (#20 item 3).

Each variant reads ``--blocks`` 2 MiB blocks, 16 at a time into one reused 16-block stage,
from a cold page cache (``posix_fadvise(DONTNEED)`` first) unless it says "warm"; process CPU
per GB (all threads) and wall GB/s, as ranges over the rounds:

* ``raw``: one ``readinto`` per block of a plain file (``bench_cache_io.py``'s baseline);
* ``raw 256K preads + xxh3``: the tier's I/O pattern without the tier (8 ``preadv`` of 256 KiB
  per block, each piece hashed with streaming XXH3-64 right after its read);
* ``into``: ``get_many_into`` as shipped (no read-ahead hint; each stream of adjacent runs
  read in order by one thread through its own open file description);
* ``into session 13``: as shipped until session 13 (every run announced with
  ``POSIX_FADV_WILLNEED``, runs read in parallel through the tier's one shared descriptor);
  ``into WILLNEED`` and ``into shared descriptor``: one of the two old choices each;
* ``into calling thread``: every stream read in the calling thread (no reader threads);
* ``get_many released``: the store's read, 16 blocks per call, pages released after use (the
  tier's page pool reuses their memory; since session 16 read with ``O_DIRECT`` into the
  pool's frames, a second thread making the reads while the calling one hashes, see
  ``SegmentReads._direct_readers``); ``get_many released, one thread``: the same with one
  thread alternating reads and hashes; ``get_many released, buffered``: through the page
  cache, as until session 15 (one thread);
* ``raw warm`` / ``into warm``: the same reads from a page cache that holds every byte.

The order of the variants is rotated every round and each timed variant runs right after a
cold raw read, its paired baseline: where a read runs in the round changes its cost on this
VM (see the comment in ``_run`` and ``benchmarks/results/cache.md``, session 15).

What session 14 found (``benchmarks/results/cache.md``): ``WILLNEED`` and reads the kernel
judges random (runs of one file read at once through one descriptor) fill the page cache with
4 KiB folios instead of the large folios of its own sequential readahead; counted with
``perf stat -e filemap:mm_filemap_add_to_page_cache``.

    .venv/bin/python benchmarks/bench_cache_into.py [--blocks 256] [--rounds 3] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
import xxhash

sys.path.insert(0, os.path.dirname(__file__))
from bench_cache_io import MIB, PAGE, drop_cache, drop_dir, key

from deepinfer_cache.meta import BlockMeta
from deepinfer_cache.tiers.segment_disk import SegmentDiskTier

BLOCK = 2 * MIB
STAGE = 16


class _Inline:
    """Runs a submitted read at once in the calling thread (no reader threads)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        fut.set_result(fn(*args))
        return fut


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="a directory on the disk to measure")
    ap.add_argument(
        "--only",
        default=None,
        help="comma-separated variant names to run (raw is always run: it is the baseline); "
        "e.g. count page-cache folios of one variant: perf stat -e "
        "filemap:mm_filemap_add_to_page_cache ... --rounds 1 --only into, minus --only raw",
    )
    args = ap.parse_args()
    n = args.blocks
    root = tempfile.mkdtemp(prefix="bench_cache_into_", dir=args.dir)
    try:
        _run(root, n, args.rounds, None if args.only is None else args.only.split(","))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(root: str, n: int, rounds: int, only: list[str] | None) -> None:
    pages = [torch.randn(PAGE).to(torch.bfloat16) for _ in range(STAGE)]
    raw = os.path.join(root, "raw.bin")
    with open(raw, "wb") as f:
        for i in range(n):
            f.write(pages[i % STAGE].view(torch.uint8).numpy().tobytes())
        os.fsync(f.fileno())
    tier_dir = os.path.join(root, "seg")
    tier = SegmentDiskTier(
        tier_dir,
        PAGE,
        torch.bfloat16,
        4 * n * BLOCK,
        io_threads=2,
        queue_depth=64,
        max_read_bytes=8 * MIB,
    )
    meta = BlockMeta(None, "chat", 4e9)
    for i in range(n):
        assert tier.put(key(i), pages[i % STAGE], meta, block=True)
    assert tier.flush()
    # One read first so that the page pool holds a request's pages, as the stage below and
    # the raw loops' buffers are allocated before any timing.
    assert all(g is not None for g in tier.get_many([key(i) for i in range(STAGE)]))
    stage = torch.zeros((STAGE, *PAGE), dtype=torch.bfloat16)
    rows = [memoryview(stage[i].reshape(-1).view(torch.uint8).numpy()) for i in range(STAGE)]

    def timed(fn: Callable[[], None]) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - t0, time.process_time() - c0

    def raw_read(cold: bool) -> tuple[float, float]:
        if cold:
            drop_cache(raw)

        def go() -> None:
            with open(raw, "rb", buffering=0) as f:
                for i in range(n):
                    f.readinto(rows[i % STAGE])

        return timed(go)

    def raw_pieces() -> tuple[float, float]:
        drop_cache(raw)
        piece = 256 << 10

        def go() -> None:
            fd = os.open(raw, os.O_RDONLY)
            try:
                for i in range(n):
                    row, h = rows[i % STAGE], xxhash.xxh3_64()
                    for p in range(0, BLOCK, piece):
                        os.preadv(fd, [row[p : p + piece]], i * BLOCK + p)
                        h.update(row[p : p + piece])
            finally:
                os.close(fd)

        return timed(go)

    def into(
        cold: bool = True, hint: str = "none", own: bool = True, inline: bool = False
    ) -> tuple[float, float]:
        if cold:
            drop_dir(tier_dir)
        readers = tier._readers
        tier._read_hint = hint
        tier._own_readahead = own
        if inline:
            tier._readers = _Inline()  # type: ignore[assignment]

        def go() -> None:
            for lo in range(0, n, STAGE):
                ks = [key(i) for i in range(lo, min(n, lo + STAGE))]
                assert all(tier.get_many_into(ks, stage[: len(ks)]))

        try:
            return timed(go)
        finally:
            tier._readers = readers
            tier._read_hint = "none"
            tier._own_readahead = True

    def get_many_released(direct: bool = True, one_thread: bool = False) -> tuple[float, float]:
        drop_dir(tier_dir)
        tier._direct_readers = 0 if one_thread else SegmentDiskTier._direct_readers
        tier._direct_reads = direct

        def go() -> None:
            for lo in range(0, n, STAGE):
                got = tier.get_many([key(i) for i in range(lo, min(n, lo + STAGE))])
                assert all(g is not None for g in got)
                del got

        try:
            return timed(go)
        finally:
            tier._direct_readers = SegmentDiskTier._direct_readers
            tier._direct_reads = True

    variants: dict[str, Callable[[], tuple[float, float]]] = {
        "raw": lambda: raw_read(True),
        "raw 256K preads + xxh3": raw_pieces,
        "into": into,
        "into session 13": lambda: into(hint="willneed", own=False),
        "into WILLNEED": lambda: into(hint="willneed"),
        "into shared descriptor": lambda: into(own=False),
        "into calling thread": lambda: into(inline=True),
        "get_many released": get_many_released,
        "get_many released, one thread": lambda: get_many_released(one_thread=True),
        "get_many released, buffered": lambda: get_many_released(direct=False),
        "raw warm": lambda: raw_read(False),
        "into warm": lambda: into(cold=False),
    }
    if only is not None:
        unknown = sorted(set(only) - set(variants))
        if unknown:
            raise SystemExit(f"--only: unknown variants {unknown}; known: {list(variants)}")
        variants = {k: fn for k, fn in variants.items() if k == "raw" or k in only}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    # How much a cold read costs here depends on where it runs in the round, not only on its
    # code: "into" and "into calling thread" run the same code for these one-stream requests,
    # yet whichever ran third (the first cold tier read of a round) used 0.50-0.89 s of CPU
    # per GB and the other 0.37-0.46 (session 15, both orders tried): on this VM freed memory
    # goes back to the host and is slow to touch again (benchmarks/results/cache.md). So the
    # order is rotated every round (each variant meets several positions) and each variant's
    # baseline is a cold raw read run right before it (paired, not one raw read per round,
    # several variants earlier).
    paired: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for fn in variants.values():  # one untimed round: first-use costs are not a read's cost
        fn()
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = variants[name]
            paired[name].append(variants["raw"]() if name != "raw" else (float("nan"), 0.0))
            got[name].append(fn())
            if name == "raw":
                paired[name][-1] = got[name][-1]
    tier.close()
    gb = n * BLOCK / 1e9
    print(
        f"{n} blocks of 2 MiB, {rounds} rounds after an untimed one, order rotated each round, "
        "each variant right after a cold raw read (its baseline); process CPU (all threads) "
        "per GB"
    )
    for name, runs in got.items():
        walls = [w for w, _ in runs]
        cpus = [c for _, c in runs]
        ratio = [c / b for (_, c), (_, b) in zip(runs, paired[name])]
        speed = [b / w for (w, _), (b, _) in zip(runs, paired[name])]  # throughput / raw's
        print(
            f"  {name:24s} {gb / max(walls):5.2f}-{gb / min(walls):5.2f} GB/s wall "
            f"({min(speed):.2f}-{max(speed):.2f} of cold raw), "
            f"CPU {min(cpus) / gb:.2f}-{max(cpus) / gb:.2f} s/GB "
            f"({min(ratio):.1f}-{max(ratio):.1f}x cold raw, paired)"
        )


if __name__ == "__main__":
    main()
