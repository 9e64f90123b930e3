"""CPU per 2 MiB block read from a warm page cache by ``SegmentDiskTier.get_many_into``, with
a large record's payload hashed in 256 KiB pieces as it lands (the default) against one hash of
the whole record after its read, alternated in rounds in this one process.

    .venv/bin/python benchmarks/bench_cache_read_pieces.py [--blocks 64] [--rounds 6]

The page cache is warm on purpose: the difference is CPU (hashing from the core's L2 or from
L3), and a cold read would add disk time that swings with the machine's load.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import torch

import deepinfer_cache.tiers.segment_read as segment_read
from deepinfer_cache import BlockMeta, SegmentDiskTier

PAGE = (2, 64, 64, 128)  # bf16: 2 MiB per block
STAGE = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    n = max(STAGE, args.blocks - args.blocks % STAGE)
    d = tempfile.mkdtemp(prefix="bench_read_pieces_")
    default_piece = segment_read._PIECE_BYTES
    try:
        tier = SegmentDiskTier(d, PAGE, torch.bfloat16, 1 << 34, max_read_bytes=8 << 20)
        pages = [torch.randn(PAGE).to(torch.bfloat16) for _ in range(8)]

        def key(i: int) -> bytes:
            return i.to_bytes(16, "little")

        for i in range(n):
            assert tier.put(key(i), pages[i % 8], BlockMeta(None, "chat", 4e9), block=True)
        assert tier.flush()
        stage = torch.zeros((STAGE, *PAGE), dtype=torch.bfloat16)

        def read_all() -> None:
            for lo in range(0, n, STAGE):
                assert all(tier.get_many_into([key(i) for i in range(lo, lo + STAGE)], stage))

        read_all()  # warm the page cache
        cpu: dict[str, list[float]] = {"whole": [], "pieces": []}
        for _ in range(args.rounds):
            for name, piece in (("whole", 1 << 40), ("pieces", default_piece)):
                segment_read._PIECE_BYTES = piece
                c0 = time.process_time()
                read_all()
                cpu[name].append((time.process_time() - c0) / n * 1e3)
        ratios = [w / p for w, p in zip(cpu["whole"], cpu["pieces"])]
        for name, xs in cpu.items():
            print(
                f"{name:6s} CPU per 2 MiB block {min(xs):.3f}-{max(xs):.3f} ms "
                f"(median {statistics.median(xs):.3f})"
            )
        print(
            f"whole/pieces CPU per round {min(ratios):.2f}-{max(ratios):.2f}x "
            f"(median {statistics.median(ratios):.2f}x)"
        )
        tier.close()
    finally:
        segment_read._PIECE_BYTES = default_piece
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
