"""``python -m deepinfer.lean.prepare MODEL.gguf [--cache-dir DIR]``: convert a GGUF file and
write its blocks file with the engine's code (this process imports torch), then print the
converted directory. The lean runtime runs it in a child process when the files are missing."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepinfer.lean.prepare")
    parser.add_argument("model", help="GGUF file")
    parser.add_argument("--cache-dir", default=None, help="converted models' directory")
    args = parser.parse_args(argv)
    from deepinfer.models.convert import convert_gguf
    from deepinfer.models.gguf_model import load_gguf_model_cached

    directory = convert_gguf(args.model, args.cache_dir)
    load_gguf_model_cached(args.model, directory)  # writes gguf-blocks.st when missing
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
