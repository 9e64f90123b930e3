"""Where the lean runtime finds a GGUF model's files: the engine's own converted directory.

The engine converts a GGUF file once (``deepinfer.models.convert``: tokenizer, config, a
fingerprint of the source in ``deepinfer.json``) and keeps its tensors, block bytes as they are
in the file, in ``gguf-blocks.st`` beside them (``deepinfer.models.gguf_model``). The lean runtime
reads the same directory, checked the same way without torch: the fingerprint names this
source (name, size, SHA-256) and this conversion format, the files it reads have their recorded
SHA-256, and the blocks file records this very conversion. A missing or stale directory is
(re)built by the engine's own code in a child process (:func:`prepare`), so this process never
imports torch; nothing half-written or foreign is ever read.

Why not ``gguf.GGUFReader`` on the file itself: it parses every metadata field into numpy
objects (the 49k-token vocabulary) and reads the whole file doing so: 4.5 s and a 193 MB peak
on the embedded model, more than llama.cpp's whole process. The blocks file is a memory map
whose header is a few kB of JSON.

Example::

    files = lean_files("SmolLM2-135M-Instruct.Q4_1.gguf")  # prepares it once if needed
    files.blocks  # .../gguf-blocks.st
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepinfer.models.cache_files import cache_base, file_sha256

# The engine's constants (deepinfer.models.convert / gguf_model, which import torch);
# tests/deepinfer/test_lean_files.py keeps them equal.
CONVERSION_FORMAT = 3
MARKER = "deepinfer.json"
CONVERSION_DTYPE = "bfloat16"
BLOCKS_FILE = "gguf-blocks.st"
BLOCKS_FORMAT = 2
# The files of the conversion this runtime reads (their recorded SHA-256 is checked).
READ_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
PREPARE_TIMEOUT_S = 900


@dataclass(frozen=True)
class LeanFiles:
    """A GGUF model's converted directory, checked: ``blocks`` is its ``gguf-blocks.st``,
    ``marker`` the text of its ``deepinfer.json`` (the blocks file records it)."""

    source: Path
    directory: Path
    marker: str

    @property
    def blocks(self) -> Path:
        return self.directory / BLOCKS_FILE


def candidate_dirs(source: Path, cache_dir: str | os.PathLike[str] | None) -> list[Path]:
    """Where the engine puts ``source``'s conversion: the cache (``cache_dir``, else
    ``$DEEPINFER_CACHE_DIR/models``), then its fallback for an unwritable cache."""
    root = Path(cache_dir) if cache_dir is not None else cache_base() / "models"
    fallback = Path(tempfile.gettempdir()) / f"deepinfer-{os.getuid()}" / "models"
    return [root / source.stem, fallback / source.stem]


def check_converted(source: Path, directory: Path) -> LeanFiles | None:
    """``directory`` as :class:`LeanFiles` when it is a complete conversion of ``source`` with
    its blocks file (see the module doc), else None."""
    try:
        marker = (directory / MARKER).read_text(encoding="utf-8")
        recorded: Any = json.loads(marker)
        if not isinstance(recorded, dict):
            return None
        want = {
            "format_version": CONVERSION_FORMAT,
            "source_name": source.name,
            "source_size": source.stat().st_size,
            "dtype": CONVERSION_DTYPE,
        }
        if any(recorded.get(k) != v for k, v in want.items()):
            return None
        files = recorded.get("files")
        if not isinstance(files, dict) or any(files.get(n) is None for n in READ_FILES):
            return None
        if recorded.get("source_sha256") != file_sha256(source):
            return None
        if any(file_sha256(directory / n) != files[n] for n in READ_FILES):
            return None
        from deepinfer.lean.safetensors_map import SafetensorsMap

        meta = SafetensorsMap(directory / BLOCKS_FILE).metadata
        if meta.get("format") != str(BLOCKS_FORMAT) or meta.get("source") != marker:
            return None
    except (OSError, ValueError):
        return None
    return LeanFiles(source, directory, marker)


def find_lean_files(
    source: Path, cache_dir: str | os.PathLike[str] | None = None
) -> LeanFiles | None:
    """The checked conversion of ``source`` where the engine keeps it, or None."""
    for directory in candidate_dirs(source, cache_dir):
        found = check_converted(source, directory)
        if found is not None:
            return found
    return None


def prepare(source: Path, cache_dir: str | os.PathLike[str] | None = None) -> LeanFiles:
    """Convert ``source`` and write its blocks file with the engine's code, in a child process
    (it imports torch; this one does not), and return the result, checked."""
    cmd = [sys.executable, "-m", "deepinfer.lean.prepare", os.fspath(source)]
    if cache_dir is not None:
        cmd += ["--cache-dir", os.fspath(cache_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=PREPARE_TIMEOUT_S)
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"preparing {source.name} for the lean runtime failed: {tail}")
    directory = Path(done.stdout.strip().splitlines()[-1])
    found = check_converted(source, directory)
    if found is None:
        raise RuntimeError(f"{directory} is not a complete conversion of {source.name}")
    return found


def lean_files(
    model: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None = None
) -> LeanFiles:
    """The checked files of the GGUF ``model`` (None: the embedded default), prepared first
    when missing. ``ValueError`` for anything but a ``.gguf`` file."""
    from deepinfer.models.registry import default_model_path

    source = default_model_path() if model is None else Path(model)
    if not (source.is_file() and source.suffix == ".gguf"):
        raise ValueError(f"model: the lean runtime runs a .gguf file, got {os.fspath(source)!r}")
    return find_lean_files(source, cache_dir) or prepare(source, cache_dir)
