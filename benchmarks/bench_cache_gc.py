"""Full garbage-collection pause with and without a ~1M-block ``PrefixIndex`` (#20 item 8).

Measures ``gc.collect()`` in one process before building the index (the baseline: torch's own
objects) and after, plus the number of tracked objects; a flat index adds none per block.

    .venv/bin/python benchmarks/bench_cache_gc.py [--blocks 960000]
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
import torch

from deepinfer_cache import HostTier, TieredKVStore, hash_token_blocks


def pauses(n: int = 5) -> str:
    gc.collect()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - t0) * 1e3)
    return f"{min(out):.0f}-{max(out):.0f} ms ({len(gc.get_objects()):,} tracked objects)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=960_000)
    args = ap.parse_args()
    store = TieredKVStore([HostTier((1,), torch.float32, 1 << 12) for _ in range(3)], 64)
    rng = np.random.default_rng(0)
    print(f"full gc.collect() before the index: {pauses()}")
    for c in range(max(1, args.blocks // 1200)):
        toks = rng.integers(0, 128_000, 1200 * 64, np.int32)
        store.index.insert(hash_token_blocks(toks, 64), tier=c % 3)
    print(f"full gc.collect() with {len(store.index):,} blocks indexed: {pauses()}")
    store.close()


if __name__ == "__main__":
    main()
