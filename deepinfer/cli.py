"""The `deepinfer` command line."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinfer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the main job on the embedded default model")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        print("deepinfer demo: the engine does not exist yet; nothing end-to-end to run.")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
