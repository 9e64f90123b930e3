"""PrefixIndex figures (wall clock and this thread's CPU time: on a shared machine the CPU
time is what the code costs): match of a 77k-token prompt (block 64) against a warm 1M-block index,
hashing included, through ``PrefixIndex.match`` and through ``TieredKVStore.lookup``; a lookup
that misses on its first block; inserts per second; hashing throughput; the pause of a full
garbage collection with the index loaded; hashing under both key schemes (``xxh3_128``, the
default, and ``blake2b``), alternated in rounds.

    .venv/bin/python benchmarks/bench_cache_index.py [--blocks 1000000] [--reps 200] [--ab REV]

``--ab REV`` also times ``store.lookup`` of the package as it was at git revision ``REV``
(extracted with ``git archive`` and imported as ``deepinfer_cache_ab``; its imports are
relative) on an index filled with the same conversations, alternating old and new in rounds
in this one process, and prints the old/new CPU ratio per round as a range.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from types import ModuleType
from typing import Any

import numpy as np
import torch

from deepinfer_cache import KEY_HASHES, HostTier, TieredKVStore, hash_token_blocks

BLOCK = 64
PROMPT = 77_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--ab", metavar="REV", help="also time lookups of the package at git REV")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    base_pauses = _gc_pauses()
    # The store's own index, filled directly (lookup reads only the index; no pages needed).
    store = TieredKVStore(
        [HostTier((1,), torch.float32, 1 << 12) for _ in range(3)], block_size=BLOCK
    )
    idx = store.index

    # Warm index: conversations of ~1200 blocks (a 77k prompt each) sharing a system prompt.
    system = rng.integers(0, 128_000, size=16 * BLOCK, dtype=np.int32)
    per_conv = PROMPT // BLOCK
    n_conv = max(1, args.blocks // per_conv)
    chains = []
    t_hash = 0.0
    for _ in range(n_conv):
        body = rng.integers(0, 128_000, size=PROMPT - system.size, dtype=np.int32)
        toks = np.concatenate([system, body])
        t0 = time.thread_time()
        chains.append(hash_token_blocks(toks, BLOCK))
        t_hash += time.thread_time() - t0
    t0, c0 = time.perf_counter(), time.thread_time()
    for i, hs in enumerate(chains):
        idx.insert(hs, tier=i % 3)
    t_insert, c_insert = time.perf_counter() - t0, time.thread_time() - c0
    inserted = sum(len(h) for h in chains)
    print(f"index size: {len(idx):,} blocks ({n_conv} conversations)")
    print(f"hashing: {inserted * BLOCK / t_hash / 1e6:.1f} M tokens/s CPU (numpy int32 input)")
    print(
        f"insert: {inserted / t_insert:,.0f} blocks/s wall, {inserted / c_insert:,.0f} blocks/s "
        f"CPU ({t_insert:.1f} s wall for {inserted:,})"
    )

    probe_np = np.concatenate([system, rng.integers(0, 128_000, PROMPT - system.size, np.int32)])
    idx.insert(hash_token_blocks(probe_np, BLOCK), tier=2)
    probe_list = probe_np.tolist()
    for name, probe in (("numpy int32", probe_np), ("python list", probe_list)):
        times, cpu, hash_cpu = [], [], []
        for _ in range(args.reps):
            t0, c0 = time.perf_counter(), time.thread_time()
            hs = hash_token_blocks(probe, BLOCK)
            c1 = time.thread_time()
            m = idx.match(hs)
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            hash_cpu.append(c1 - c0)
        assert m.num_blocks == PROMPT // BLOCK
        print(
            f"match 77k-token prompt ({name}, hashing included): "
            f"wall median {statistics.median(times) * 1e3:.2f} ms, "
            f"CPU median {statistics.median(cpu) * 1e3:.2f} ms "
            f"(of which hashing {statistics.median(hash_cpu) * 1e3:.2f} ms), "
            f"{m.num_blocks} blocks hit"
        )
    for name, probe in (("numpy int32", probe_np), ("python list", probe_list)):
        times, cpu = [], []
        for _ in range(args.reps):
            t0, c0 = time.perf_counter(), time.thread_time()
            res = store.lookup(probe)
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        assert res.num_blocks == PROMPT // BLOCK
        print(
            f"store.lookup 77k-token prompt ({name}): wall median "
            f"{statistics.median(times) * 1e3:.2f} ms, CPU median {statistics.median(cpu) * 1e3:.2f} ms"
        )
    # The engine's path: the sequence's BlockHashChain already holds the prompt's hashes (made
    # as its tokens arrived), so the lookup converts and hashes nothing.
    chain = store.hash_chain()
    chain.update(probe_list)
    times, cpu = [], []
    for _ in range(args.reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        res = store.lookup(probe_list, block_hashes=chain)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    assert res.num_blocks == PROMPT // BLOCK and chain.blocks_hashed == PROMPT // BLOCK
    print(
        f"store.lookup 77k-token prompt (python list, hashes kept in a BlockHashChain as the "
        f"engine does): wall median {statistics.median(times) * 1e3:.2f} ms, CPU median "
        f"{statistics.median(cpu) * 1e3:.2f} ms"
    )
    miss = (probe_np + 1).tolist()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        assert store.lookup(miss).num_blocks == 0
        times.append(time.perf_counter() - t0)
    one_block = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        hash_token_blocks(miss[:BLOCK], BLOCK)
        one_block.append(time.perf_counter() - t0)
    print(
        f"store.lookup 77k-token prompt missing its first block: wall median "
        f"{statistics.median(times) * 1e6:.0f} us (hashing that one block alone: "
        f"{statistics.median(one_block) * 1e6:.0f} us)"
    )
    # The two key schemes, alternated in rounds so machine load hits both alike.
    per = {k: [] for k in KEY_HASHES}
    for _ in range(max(1, args.reps // 20)):
        for key_hash in KEY_HASHES:
            c0 = time.thread_time()
            for _ in range(20):
                hash_token_blocks(probe_np, BLOCK, key_hash=key_hash)
            per[key_hash].append((time.thread_time() - c0) / 20)
    ratios = [b / x for b, x in zip(per["blake2b"], per["xxh3_128"])]
    print(
        "hashing a 77k-token prompt, CPU per call: "
        + ", ".join(
            f"{k} {min(v) * 1e3:.2f}-{max(v) * 1e3:.2f} ms (median {statistics.median(v) * 1e3:.2f})"
            for k, v in per.items()
        )
        + f"; blake2b/xxh3_128 per round {min(ratios):.1f}-{max(ratios):.1f}x"
    )
    if args.ab:
        _ab(args.ab, store, len(chains), probe_np, args.reps)
    del chains
    pauses = _gc_pauses()
    print(
        f"full gc.collect(): {min(base_pauses) * 1e3:.0f}-{max(base_pauses) * 1e3:.0f} ms before "
        f"the index was built, {min(pauses) * 1e3:.0f}-{max(pauses) * 1e3:.0f} ms with "
        f"{len(idx):,} blocks indexed ({len(gc.get_objects()):,} tracked objects in the process)"
    )
    worst = 0.0
    extra = [
        hash_token_blocks(rng.integers(0, 128_000, 64 * BLOCK, np.int32), BLOCK) for _ in range(200)
    ]
    for hs in extra:  # inserts with the collector running as it pleases
        t0 = time.perf_counter()
        idx.insert(hs, tier=0)
        worst = max(worst, time.perf_counter() - t0)
    print(f"slowest of 200 inserts (64 blocks each) with automatic GC: {worst * 1e3:.2f} ms")
    store.close()


def _baseline_package(rev: str) -> ModuleType:
    """``deepinfer_cache`` as of git revision ``rev``, imported as ``deepinfer_cache_ab``."""
    tar = subprocess.run(
        ["git", "archive", rev, "deepinfer_cache/src/deepinfer_cache"],
        capture_output=True,
        check=True,
    ).stdout
    tmp = tempfile.mkdtemp(prefix="bench_cache_ab_")
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(tmp, filter="data")
    os.rename(
        os.path.join(tmp, "deepinfer_cache", "src", "deepinfer_cache"),
        os.path.join(tmp, "deepinfer_cache_ab"),
    )
    sys.path.insert(0, tmp)
    return importlib.import_module("deepinfer_cache_ab")


def _ab(rev: str, store: Any, n_conv: int, probe: np.ndarray, reps: int) -> None:
    """Old and new ``store.lookup`` on indexes holding the same conversations (each under its
    own key scheme), alternated in rounds; CPU time of this thread per lookup."""
    old_pkg = _baseline_package(rev)
    old = old_pkg.TieredKVStore(
        [old_pkg.HostTier((1,), torch.float32, 1 << 12) for _ in range(3)], block_size=BLOCK
    )
    # Same chain shapes (conversations sharing a 16-block system prompt), keyed the old way:
    # fresh random bodies (the new index's tokens were not kept), the same probe.
    system = probe[: 16 * BLOCK]
    rng = np.random.default_rng(1)
    for i in range(n_conv):
        toks = np.concatenate([system, rng.integers(0, 128_000, PROMPT - system.size, np.int32)])
        old.index.insert(old_pkg.hash_token_blocks(toks, BLOCK), tier=i % 3)
    old.index.insert(old_pkg.hash_token_blocks(probe, BLOCK), tier=2)
    probe_list = probe.tolist()
    assert old.lookup(probe).num_blocks == store.lookup(probe).num_blocks == PROMPT // BLOCK
    rounds = max(3, reps // 20)
    for name, arg in (("numpy int32", probe), ("python list", probe_list)):
        cpu: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(rounds):
            for label, s in (("old", old), ("new", store)):
                c0 = time.thread_time()
                for _ in range(20):
                    s.lookup(arg)
                cpu[label].append((time.thread_time() - c0) / 20)
        ratios = [o / n for o, n in zip(cpu["old"], cpu["new"])]
        print(
            f"A/B store.lookup 77k tokens ({name}), {rounds} alternated rounds of 20: "
            f"{rev} {min(cpu['old']) * 1e3:.2f}-{max(cpu['old']) * 1e3:.2f} ms, "
            f"now {min(cpu['new']) * 1e3:.2f}-{max(cpu['new']) * 1e3:.2f} ms CPU; "
            f"old/new per round {min(ratios):.1f}-{max(ratios):.1f}x"
        )
    old.close()


def _gc_pauses(n: int = 3) -> list[float]:
    gc.collect()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        gc.collect()
        out.append(time.perf_counter() - t0)
    return out


if __name__ == "__main__":
    main()
