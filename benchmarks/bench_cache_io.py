"""DiskTier and HostTier bandwidth for 2 MiB blocks against baselines measured in the same run:
raw sequential file I/O on the same disk, and ``torch.Tensor.copy_``; then both disk formats
(one file per block, segments) side by side against the same raw baselines.

    .venv/bin/python benchmarks/bench_cache_io.py [--dir /path/on/ssd] [--blocks 256]
    .venv/bin/python benchmarks/bench_cache_io.py --only segments   # the format comparison

Reads start from a cold page cache (``posix_fadvise(DONTNEED)`` on every file first), for the
raw baseline and for the tier alike.

The segment read ratio's baseline (#20 item 7, "a cold raw sequential read of the same
bytes") reads each 2 MiB block into a fresh destination, as a real reader must and as
``get_many`` does (it returns a new page per block): the page faults of fresh memory are part
of reading a block. Until deepinfer-cache 0.4 the baseline re-read one 2 MiB buffer that stayed
in the CPU cache, which no reader returning pages can do; that figure is still printed
("reused 2 MiB buffer"). ``get_many_into`` (into a reused 16-block staging buffer) is compared
with the raw read into the same kind of staging buffer. Since the tier reads pages into its
``PagePool`` (deepinfer-cache, #20 session 14), ``get_many`` in requests of 16 blocks whose
pages are released (what ``fetch`` does after copying them to the device) is compared with
the strict baseline too: a raw read into one reused buffer, as ``dd`` or ``fio`` measure it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import zlib

import torch
import xxhash

from deepinfer_cache import BlockMeta, DiskTier, HostTier, SegmentDiskTier

PAGE = (2, 64, 64, 128)  # bf16: 2 MiB per block
MIB = 1 << 20


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_write(path: str, pages: list[torch.Tensor]) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for p in pages:
        mv = memoryview(p.view(torch.uint8).numpy())
        while mv.nbytes:
            mv = mv[os.write(fd, mv) :]
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def raw_read(path: str, n: int, chunk_blocks: int = 1) -> float:
    """Cold sequential read of ``n`` 2 MiB blocks in reads of ``chunk_blocks`` blocks into one
    reused buffer (a 2 MiB buffer stays in the CPU cache, a 32 MiB one does not)."""
    drop_cache(path)
    buf = bytearray(chunk_blocks * 2 * MIB)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        for _ in range(0, n, chunk_blocks):
            f.readinto(buf)
    return time.perf_counter() - t0


def raw_read_fresh(path: str, n: int) -> float:
    """Cold sequential read of ``n`` 2 MiB blocks, each into a fresh destination tensor that
    is kept (what ``get_many`` returns): the fair baseline for a reader that returns pages."""
    drop_cache(path)
    t0 = time.perf_counter()
    kept = []
    with open(path, "rb", buffering=0) as f:
        for _ in range(n):
            dest = torch.empty(2 * MIB, dtype=torch.uint8)
            f.readinto(memoryview(dest.numpy()))
            kept.append(dest)
    t = time.perf_counter() - t0
    del kept
    return t


def raw_read_staged(path: str, n: int, stage_blocks: int = 16) -> float:
    """Cold sequential read of ``n`` 2 MiB blocks into the rows of a reused (already faulted
    in) ``stage_blocks``-block staging buffer, one read per block: the baseline of
    ``get_many_into``."""
    drop_cache(path)
    stage = torch.zeros((stage_blocks, 2 * MIB), dtype=torch.uint8)
    rows = [memoryview(stage[i].numpy()) for i in range(stage_blocks)]
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        for i in range(n):
            f.readinto(rows[i % stage_blocks])
    return time.perf_counter() - t0


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def bench_disk(directory: str, n: int, threads: int) -> None:
    pages = [torch.randn(PAGE).to(torch.bfloat16) for _ in range(min(n, 16))]
    pages = [pages[i % len(pages)] for i in range(n)]
    nbytes = n * 2 * MIB
    raw = os.path.join(directory, "raw.bin")
    t_raw_w = raw_write(raw, pages)
    tier_dir = os.path.join(directory, "tier")
    tier = DiskTier(tier_dir, PAGE, torch.bfloat16, 4 * nbytes, io_threads=threads, queue_depth=64)
    meta = BlockMeta(None, "chat", 4e9)
    t0 = time.perf_counter()
    for i, p in enumerate(pages):
        assert tier.put(key(i), p, meta, block=True)
    tier.flush()
    t_tier_w = time.perf_counter() - t0
    t_raw_r = raw_read(raw, n)
    for i in range(n):
        drop_cache(tier.path_of(key(i)))
    t0 = time.perf_counter()
    got = tier.get_many([key(i) for i in range(n)])
    t_tier_r = time.perf_counter() - t0
    assert all(g is not None for g in got)
    del got
    for i in range(n):
        drop_cache(tier.path_of(key(i)))
    t0 = time.perf_counter()
    for i in range(n):
        assert tier.get(key(i)) is not None
    t_tier_r1 = time.perf_counter() - t0
    tier.close()
    t0 = time.perf_counter()
    tier = DiskTier(tier_dir, PAGE, torch.bfloat16, 4 * nbytes)
    t_open = time.perf_counter() - t0
    assert len(tier.recovered()) == n
    tier.close()
    gb = nbytes / 1e9
    print(f"disk ({n} x 2 MiB = {nbytes / MIB:.0f} MiB, {threads} I/O threads, fsync per block)")
    print(f"  raw sequential write  {gb / t_raw_w:6.2f} GB/s")
    print(f"  DiskTier write        {gb / t_tier_w:6.2f} GB/s  ratio {t_raw_w / t_tier_w:.2f}")
    print(f"  raw sequential read   {gb / t_raw_r:6.2f} GB/s")
    print(
        f"  DiskTier read (get_many, 4 reader threads) {gb / t_tier_r:6.2f} GB/s  ratio {t_raw_r / t_tier_r:.2f}"
    )
    print(f"  reopen (header-only scan of {n} blocks) {t_open * 1e3:.1f} ms")
    print(
        f"  DiskTier read (one get at a time)          {gb / t_tier_r1:6.2f} GB/s  ratio {t_raw_r / t_tier_r1:.2f}"
    )


def drop_dir(path: str) -> None:
    for root, _, names in os.walk(path):
        for name in names:
            if name != ".lock":
                drop_cache(os.path.join(root, name))


def bench_segments(directory: str, n: int, threads: int) -> None:
    """SegmentDiskTier against the raw baselines and DiskTier, all in this run, reads cold."""
    pages = [torch.randn(PAGE).to(torch.bfloat16) for _ in range(min(n, 16))]
    pages = [pages[i % len(pages)] for i in range(n)]
    nbytes = n * 2 * MIB
    raw = os.path.join(directory, "raw.bin")
    t_raw_w = raw_write(raw, pages)
    meta = BlockMeta(None, "chat", 4e9)
    times: dict[str, tuple[float, float, float, float, float]] = {}
    cpu: dict[str, float] = {}  # process CPU (all threads, user + system) of a cold read
    for name, cls in (("DiskTier", DiskTier), ("SegmentDiskTier", SegmentDiskTier)):
        tier_dir = os.path.join(directory, name)
        kw = {"max_read_bytes": 8 * MIB} if cls is SegmentDiskTier else {}
        tier = cls(
            tier_dir, PAGE, torch.bfloat16, 4 * nbytes, io_threads=threads, queue_depth=64, **kw
        )
        t0 = time.perf_counter()
        for i, p in enumerate(pages):
            assert tier.put(key(i), p, meta, block=True)
        assert tier.flush()
        t_w = time.perf_counter() - t0
        drop_dir(tier_dir)
        t0 = time.perf_counter()
        got = tier.get_many([key(i) for i in range(n)])
        t_r = time.perf_counter() - t0
        assert all(g is not None for g in got)
        del got
        t_into = t_r16 = float("nan")
        if isinstance(tier, SegmentDiskTier):
            # The store's read as ``fetch`` uses it: requests of 16 blocks, each page used
            # (copied to the device) and released, so the tier's page pool reuses its memory.
            # One request first, untimed, as the raw baselines allocate their buffer untimed.
            assert all(g is not None for g in tier.get_many([key(i) for i in range(16)]))
            drop_dir(tier_dir)
            t0, c0 = time.perf_counter(), time.process_time()
            for lo in range(0, n, 16):
                got = tier.get_many([key(i) for i in range(lo, min(n, lo + 16))])
                assert all(g is not None for g in got)
                del got
            t_r16 = time.perf_counter() - t0
            cpu["SegmentDiskTier get_many, 16 per call"] = time.process_time() - c0
            # Into a reused 16-block staging buffer (already faulted in), as the raw read
            # reuses its buffer: payloads land there with no intermediate copy.
            stage = torch.zeros((16, *PAGE), dtype=torch.bfloat16)
            drop_dir(tier_dir)
            t0, c0 = time.perf_counter(), time.process_time()
            for lo in range(0, n, 16):
                ks = [key(i) for i in range(lo, min(n, lo + 16))]
                assert all(tier.get_many_into(ks, stage[: len(ks)]))
            t_into = time.perf_counter() - t0
            cpu["SegmentDiskTier get_many_into"] = time.process_time() - c0
        tier.close()
        t0 = time.perf_counter()
        tier = cls(tier_dir, PAGE, torch.bfloat16, 4 * nbytes)
        t_open = time.perf_counter() - t0
        assert len(tier.recovered()) == n
        tier.close()
        times[name] = (t_w, t_r, t_open, t_into, t_r16)
    drop_cache(raw)
    c0 = time.process_time()
    t_raw_fresh = raw_read_fresh(raw, n)
    cpu["raw into fresh 2 MiB blocks"] = time.process_time() - c0
    c0 = time.process_time()
    t_raw_staged = raw_read_staged(raw, n)
    cpu["raw into a 16-block stage"] = time.process_time() - c0
    c0 = time.process_time()
    t_raw_r = raw_read(raw, n)
    cpu["raw, reused 2 MiB buffer"] = time.process_time() - c0
    t_raw_r16 = raw_read(raw, n, 16)
    gb = nbytes / 1e9
    print(f"disk formats ({n} x 2 MiB, {threads} writer threads, fsync, cold reads, get_many)")
    print(f"  raw sequential write  {gb / t_raw_w:6.2f} GB/s")
    print(f"  raw sequential read   {gb / t_raw_fresh:6.2f} GB/s (cold, into fresh 2 MiB blocks)")
    print(f"  raw sequential read   {gb / t_raw_staged:6.2f} GB/s (cold, into a 16-block stage)")
    print(f"  raw sequential read   {gb / t_raw_r:6.2f} GB/s (cold, reused 2 MiB buffer)")
    print(f"  raw sequential read   {gb / t_raw_r16:6.2f} GB/s (cold, reused 32 MiB buffer)")
    for name, (t_w, t_r, t_open, t_into, t_r16) in times.items():
        print(
            f"  {name:16s} write {gb / t_w:6.2f} GB/s ({t_raw_w / t_w:.2f} of raw)  "
            f"read {gb / t_r:6.2f} GB/s ({t_raw_fresh / t_r:.2f} of raw into fresh blocks; "
            f"{t_raw_r / t_r:.2f} of the reused 2 MiB buffer)  reopen {t_open * 1e3:.1f} ms"
        )
        if t_r16 == t_r16:
            print(
                f"  {name:16s} read, 16 blocks per get_many, pages released (page pool) "
                f"{gb / t_r16:6.2f} GB/s ({t_raw_r / t_r16:.2f} of the reused 2 MiB buffer, "
                f"{t_raw_staged / t_r16:.2f} of raw into a 16-block stage)"
            )
        if t_into == t_into:
            print(
                f"  {name:16s} read into a reused buffer (get_many_into) {gb / t_into:6.2f} GB/s "
                f"({t_raw_staged / t_into:.2f} of raw into a 16-block stage, "
                f"{t_raw_r / t_into:.2f} of the reused 2 MiB buffer)"
            )
    # Under CPU load the wall ratios follow CPU: what each read costs is the steadier figure.
    for what, c in cpu.items():
        print(f"  CPU per GB read cold  {what:30s} {c / gb:6.3f} s")


def bench_checksum(reps: int = 50) -> None:
    """CPU per 2 MiB block of the payload checks: format v2 (XXH3-64) and v1 (CRC32)."""
    data = torch.randn(PAGE).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    print("payload check, CPU per 2 MiB block")
    for name, fn in (("xxh3_64 (v2)", xxhash.xxh3_64_intdigest), ("crc32 (v1)", zlib.crc32)):
        fn(data)
        t0 = time.thread_time()
        for _ in range(reps):
            fn(data)
        print(f"  {name:14s} {(time.thread_time() - t0) / reps * 1e3:6.3f} ms")


def bench_host(n: int, reps: int) -> None:
    src = [torch.randn(PAGE).to(torch.bfloat16) for _ in range(n)]
    dst = torch.empty((n, *PAGE), dtype=torch.bfloat16)
    tier = HostTier(PAGE, torch.bfloat16, n * 2 * MIB)
    meta = BlockMeta(None, "chat", 4e9)
    best_copy = best_put = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for i, p in enumerate(src):
            dst[i].copy_(p)
        best_copy = min(best_copy, time.perf_counter() - t0)
        for i in range(n):
            tier.delete(key(i))
        t0 = time.perf_counter()
        for i, p in enumerate(src):
            tier.put(key(i), p, meta)
        best_put = min(best_put, time.perf_counter() - t0)
    gb = n * 2 * MIB / 1e9
    print(f"host ({n} x 2 MiB, best of {reps})")
    print(f"  torch copy_           {gb / best_copy:6.2f} GB/s")
    print(f"  HostTier.put          {gb / best_put:6.2f} GB/s  ratio {best_copy / best_put:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=None, help="directory on the disk to test (default: tmp)")
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--host-blocks", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", choices=["all", "segments"], default="all")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = tempfile.mkdtemp(prefix="bench_cache_", dir=args.dir)
    try:
        if args.only != "segments":
            bench_disk(base, args.blocks, args.threads)
        bench_segments(base, args.blocks, args.threads)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.only != "segments":
        bench_host(args.host_blocks, args.reps)
        bench_checksum()


if __name__ == "__main__":
    main()
