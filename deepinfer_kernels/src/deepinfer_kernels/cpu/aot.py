"""Build every CPU kernel ahead of time (``make kernels``), as FlashInfer's AOT wheels do.

    python -m deepinfer_kernels.cpu.aot            # into the package's prebuilt/ directory
    python -m deepinfer_kernels.cpu.aot --into DIR # or anywhere build_library looks

A runtime load then finds its library there (:func:`~deepinfer_kernels.cpu.build.prebuilt_dirs`)
and needs no compiler. Each library is checked against the signature table after the build.
The files are for this machine (``-march=native``, this OpenMP runtime): their names carry a
key over both, so another machine ignores them and builds its own.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

# The libraries link the OpenMP runtime torch loads (see build.py): load it first.
import torch  # noqa: F401

from deepinfer_kernels.cpu.abi import NativeAbiError
from deepinfer_kernels.cpu.build import (
    PACKAGE_PREBUILT_DIR,
    NativeBuildError,
    build_prebuilt,
    default_cache_dir,
)
from deepinfer_kernels.cpu.sources import ALL_SOURCES


def default_target() -> Path:
    """The package's ``prebuilt/`` when writable, else ``<cache>/prebuilt``."""
    try:
        PACKAGE_PREBUILT_DIR.mkdir(exist_ok=True)
    except OSError:
        return default_cache_dir() / "prebuilt"
    if os.access(PACKAGE_PREBUILT_DIR, os.W_OK):
        return PACKAGE_PREBUILT_DIR
    return default_cache_dir() / "prebuilt"


def build_all(into: Path) -> list[Path]:
    """Build and check every kernel of :data:`ALL_SOURCES` into ``into``."""
    built = []
    for source in ALL_SOURCES:
        path = build_prebuilt(source.path, into)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            path.unlink(missing_ok=True)
            raise NativeBuildError(f"cannot load {path}: {exc}") from exc
        source.check(lib)
        built.append(path)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", type=Path, default=None, help="target directory")
    args = parser.parse_args(argv)
    into = args.into if args.into is not None else default_target()
    try:
        for path in build_all(into):
            print(path)
    except (NativeBuildError, NativeAbiError) as exc:
        print(f"deepinfer-kernels: ahead-of-time build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
