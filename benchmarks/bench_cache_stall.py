"""Lookup latency while another thread stores through a slow disk (#20 item 2).

One thread keeps storing new prompts into a store whose small host tier demotes to a DiskTier;
the main thread looks up an already-cached prompt in a loop and records each lookup's latency.
Two runs in the same process: a normal disk, then the same disk with ``--stall`` seconds added
to every block file write. Lookups never wait on the disk, so the two latency distributions
should match (the slow run counts its dropped write-backs instead).

    .venv/bin/python benchmarks/bench_cache_stall.py [--stall 0.1] [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import torch

import deepinfer_cache.tiers.disk as disk_mod
from deepinfer_cache import DiskTier, HostTier, TieredKVStore

PAGE = (2, 16, 8, 64)
BS = 16


def run(directory: str, seconds: float) -> tuple[list[float], int, int]:
    page_bytes = 2 * 16 * 8 * 64 * 2
    store = TieredKVStore(
        [
            HostTier(PAGE, torch.bfloat16, 64 * page_bytes),
            DiskTier(directory, PAGE, torch.bfloat16, 1 << 30, fsync=False, queue_depth=8),
        ],
        BS,
    )
    hot = list(range(32 * BS))
    store.store(hot, torch.zeros(32, *PAGE, dtype=torch.bfloat16))
    stop = threading.Event()
    stored = [0]

    def writer() -> None:
        p = 0
        while not stop.is_set():
            t = [1_000_000 + p * 1000 + i for i in range(8 * BS)]
            stored[0] += store.store(t, torch.ones(8, *PAGE, dtype=torch.bfloat16))
            store.lookup(hot, record=False)  # keep the hot prompt resident
            p += 1

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    lat: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        assert store.lookup(hot).num_blocks == 32
        lat.append(time.perf_counter() - t0)
        time.sleep(0.0005)
    stop.set()
    th.join()
    dropped = store.stats().writeback_dropped
    store.close()
    return lat, stored[0], dropped


def summary(lat: list[float]) -> str:
    q = statistics.quantiles(lat, n=100)
    return (
        f"p50 {q[49] * 1e3:.2f} ms, p99 {q[98] * 1e3:.2f} ms, max {max(lat) * 1e3:.1f} ms "
        f"({len(lat)} lookups)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stall", type=float, default=0.1, help="seconds added per file write")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        lat, stored, dropped = run(f"{d}/a", args.seconds)
    print(
        f"normal disk: lookup {summary(lat)}; {stored} blocks stored, {dropped} write-backs dropped"
    )
    real = disk_mod.write_block_file

    def slow(*a, **kw):  # the benchmark's injected slow disk
        time.sleep(args.stall)
        real(*a, **kw)

    disk_mod.write_block_file = slow
    try:
        with tempfile.TemporaryDirectory() as d:
            lat_s, stored, dropped = run(f"{d}/b", args.seconds)
    finally:
        disk_mod.write_block_file = real
    print(
        f"disk +{args.stall * 1e3:.0f} ms per write: lookup {summary(lat_s)}; {stored} blocks "
        f"stored, {dropped} write-backs dropped"
    )
    print(
        f"p99 ratio slow/normal: {statistics.quantiles(lat_s, n=100)[98] / statistics.quantiles(lat, n=100)[98]:.2f}"
    )


if __name__ == "__main__":
    main()
