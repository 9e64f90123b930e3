"""``deepinfer-cache``: sizing calculator and reference KV sizes.

deepinfer-cache models
deepinfer-cache size --model deepseek-v3 --tokens-per-second 1e6 --hit-rate 0.96
deepinfer-cache migrate ~/.cache/deepinfer/kv/<key>   # "files" format -> "segments", in place
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import NoReturn

from .sizing import REFERENCE_MODELS, ssd_capacity


def _human(n: float, unit: str = "B") -> str:
    for prefix in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000:
            return f"{n:.3g} {prefix}{unit}"
        n /= 1000
    return f"{n:.3g} Z{unit}"


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (``deepinfer-cache size: error: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _version() -> str:
    try:
        return metadata.version("deepinfer-cache")
    except metadata.PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="deepinfer-cache", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("models", help="KV bytes per token of reference models")
    s = sub.add_parser("size", help="SSD capacity for a prefix cache")
    who = s.add_mutually_exclusive_group(required=True)
    who.add_argument("--model", choices=sorted(REFERENCE_MODELS))
    who.add_argument("--bytes-per-token", type=int)
    rate = s.add_mutually_exclusive_group(required=True)
    rate.add_argument("--tokens-per-day", type=float, help="input tokens per day")
    rate.add_argument("--tokens-per-second", type=float, help="input tokens per second")
    s.add_argument("--hit-rate", type=float, default=0.96)
    s.add_argument("--chat-fraction", type=float, default=0.5)
    s.add_argument("--chat-days", type=float, default=7.0)
    s.add_argument("--agent-days", type=float, default=3.0)
    s.add_argument("--overhead", type=float, default=0.05)
    s.add_argument("--json", action="store_true", help="print JSON")
    m = sub.add_parser(
        "migrate",
        help="convert a cache directory from the 'files' format (DiskTier, one file per "
        "block) to the 'segments' format (SegmentDiskTier) in place; crash-safe, rerunnable",
    )
    m.add_argument("directory")
    m.add_argument("--json", action="store_true", help="print JSON")
    return p


def _migrate(directory: str, as_json: bool) -> int:
    """Open the directory as a segment tier that migrates on open (geometry read from the
    block files themselves); the engine must not be running (it holds the directory lock)."""
    from dataclasses import asdict

    from .lockfile import CacheLockedError
    from .tiers import CacheFormatError, SegmentDiskTier
    from .tiers.disk_formats import files_format_geometry

    if not os.path.isdir(directory):
        print(
            f"deepinfer-cache: error: directory: {directory!r} is not a directory", file=sys.stderr
        )
        return 2
    geometry = files_format_geometry(directory)
    if geometry is None:
        print(f"{directory}: no blocks in the 'files' format; nothing to migrate")
        return 0
    dtype, shape, layout = geometry
    try:
        tier = SegmentDiskTier(directory, shape, dtype, 1 << 62, layout=layout, migrate=True)
    except (CacheLockedError, CacheFormatError, OSError) as exc:
        print(f"deepinfer-cache: error: {exc}", file=sys.stderr)
        return 1
    tier.close()
    rep = asdict(tier.migration) if tier.migration is not None else {}
    if as_json:
        print(json.dumps({"directory": directory, **rep}, indent=2))
    else:
        print(f"{directory}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in rep.items()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "migrate":
        return _migrate(args.directory, args.json)
    if args.cmd == "models":
        for name, m in sorted(REFERENCE_MODELS.items()):
            print(
                f"{name:14s} {m.bytes_per_token:>8d} B/token  ({m.bytes_per_token / 1024:.1f} KiB)"
            )
        return 0
    bpt = REFERENCE_MODELS[args.model].bytes_per_token if args.model else args.bytes_per_token
    try:
        r = ssd_capacity(
            bpt,
            input_tokens_per_day=args.tokens_per_day,
            tokens_per_second=args.tokens_per_second,
            hit_rate=args.hit_rate,
            chat_fraction=args.chat_fraction,
            chat_days=args.chat_days,
            agent_days=args.agent_days,
            overhead=args.overhead,
        )
    except ValueError as exc:
        print(f"deepinfer-cache: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0
    print(f"KV bytes per token     {r.bytes_per_token} B")
    print(f"new tokens stored/day  {_human(r.stored_tokens_per_day, 'tok')}")
    print(f"SSD writes/day         {_human(r.write_bytes_per_day)} ({_human(r.write_bandwidth)}/s)")
    print(f"SSD reads (all hits)   {_human(r.read_bandwidth)}/s")
    print(f"mean retention         {r.mean_retention_days:.2f} days")
    print(f"SSD capacity           {_human(r.capacity_bytes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
