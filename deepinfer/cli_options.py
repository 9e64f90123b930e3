"""Command-line options shared by ``deepinfer run/chat/generate`` and ``deepinfer serve``.

Kept free of heavy imports (no torch): building a parser must stay cheap for ``--help``.
"""

from __future__ import annotations

import argparse


def add_prefix_cache_args(p: argparse.ArgumentParser) -> None:
    """The prefix-cache flags; they map onto ``PrefixCacheConfig`` fields of the same names."""
    p.add_argument("--no-prefix-cache", action="store_true", help="disable the prefix cache")
    p.add_argument("--cache-dir", default=None, help="prefix cache directory (disk tier)")
    p.add_argument(
        "--cache-disk-format",
        default="segments",
        choices=["segments", "files"],
        help="disk tier format: 'segments' (default; a 'files' directory is converted in "
        "place) or 'files' (one file per block, the older format)",
    )
    p.add_argument(
        "--cache-key-hash",
        default="xxh3_128",
        choices=["xxh3_128", "blake2b"],
        help="prefix cache block-key scheme: 'xxh3_128' (default, fast) or 'blake2b' "
        "(cryptographic, for untrusted users sharing a namespace)",
    )
