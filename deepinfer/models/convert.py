"""Convert a GGUF file once into a cached Hugging Face directory (bf16 safetensors).

Dequantising a GGUF file takes seconds; loading bf16 safetensors takes well under one. The
converted directory is a normal HF model directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with the chat template) plus ``deepinfer.json``,
which records the source file's name, size and SHA-256 (about 0.1 s for the 94 MB embedded
model): a changed source is reconverted, and the same file installed in two environments (two
virtualenvs, a fresh clone next to a working tree) shares one conversion. Concurrent processes
converting the same file take turns on a lock file, so the second one finds the first one's
result instead of replacing it.

``deepinfer.json`` also records the SHA-256 of every file the conversion wrote, checked on each
load: a converted directory damaged after the fact (a truncated or bit-flipped
``model.safetensors``) is converted again, never loaded. A cache directory that cannot be
written (read-only, full) costs a warning and a conversion into a private temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from deepinfer.models.cache_files import cache_base, exclusive_lock, file_sha256
from deepinfer.models.gguf_loader import load_gguf
from deepinfer.models.safetensors_loader import save_hf_dir
from deepinfer.models.tokenizer import Tokenizer

# 2: the source is identified by content (SHA-256), not path and mtime; 3: the converted files'
# own SHA-256 are recorded and checked.
FORMAT_VERSION = 3
MARKER = "deepinfer.json"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Directory holding converted models: ``cache_dir``, else ``$DEEPINFER_CACHE_DIR/models``,
    else ``~/.cache/deepinfer/models``."""
    if cache_dir is not None:
        return Path(cache_dir)
    return cache_base() / "models"


def _fingerprint(source: Path, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "source_name": source.name,
        "source_size": source.stat().st_size,
        "source_sha256": file_sha256(source),
        "dtype": str(dtype).removeprefix("torch."),
    }


def _file_digests(directory: Path, names: list[str] | None = None) -> dict[str, str]:
    """SHA-256 of ``names`` in ``directory`` (default: every file but the marker), hashed in
    parallel: hashlib releases the GIL."""
    if names is None:
        names = sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != MARKER)
    with ThreadPoolExecutor(max_workers=min(4, max(1, len(names)))) as pool:
        digests = list(pool.map(lambda n: file_sha256(directory / n), names))
    return dict(zip(names, digests))


def is_converted(directory: Path, fingerprint: dict[str, Any]) -> bool:
    """Whether ``directory`` holds a complete, undamaged conversion of the source that
    ``fingerprint`` describes (every recorded file present with its recorded SHA-256)."""
    marker = directory / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict):
        return False
    files = recorded.pop("files", None)
    if recorded != fingerprint or not isinstance(files, dict) or not files:
        return False
    # Only the files the conversion wrote: others may keep their own files beside them.
    names = sorted(str(n) for n in files)
    if any(Path(n).name != n or n == MARKER for n in names):
        return False
    try:
        return _file_digests(directory, names) == files
    except OSError:
        return False


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
    with contextlib.suppress(OSError):  # directory fsync is not supported everywhere
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def convert_gguf(
    gguf_path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    force: bool = False,
) -> Path:
    """Return the converted directory for ``gguf_path``, converting first if needed.

    The conversion is written into a temporary sibling directory, fsynced, and renamed into
    place, so a crash never leaves a half-written model that a later start would trust
    (``deepinfer.json`` is written last and is what marks a directory complete). Processes
    converting the same target take turns on a lock file.
    """
    source = Path(gguf_path)
    if not source.is_file():
        raise ValueError(f"gguf_path {os.fspath(source)!r} is not a file")
    root = cache_root(cache_dir)
    target = root / (name or source.stem)
    fingerprint = _fingerprint(source, dtype)
    if not force and is_converted(target, fingerprint):
        return target
    try:
        return _convert_locked(source, root, target, fingerprint, dtype, force)
    except OSError as exc:
        fallback = Path(tempfile.gettempdir()) / f"deepinfer-{os.getuid()}" / "models"
        if root == fallback:
            raise
        # A read-only or full cache directory must not stop the model from loading.
        warnings.warn(
            f"model cache {os.fspath(root)!r} is not writable ({exc}); converting into "
            f"{os.fspath(fallback)!r} instead (set DEEPINFER_CACHE_DIR to keep conversions)",
            RuntimeWarning,
            stacklevel=2,
        )
        target = fallback / target.name
        if not force and is_converted(target, fingerprint):
            return target
        return _convert_locked(source, fallback, target, fingerprint, dtype, force)


def _convert_locked(
    source: Path,
    root: Path,
    target: Path,
    fingerprint: dict[str, Any],
    dtype: torch.dtype,
    force: bool,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{target.name}.lock"):
        # Another process may have finished the same conversion while this one waited.
        if force or not is_converted(target, fingerprint):
            _convert_into(source, root, target, fingerprint, dtype)
    return target


def _convert_into(
    source: Path, root: Path, target: Path, fingerprint: dict[str, Any], dtype: torch.dtype
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        config, state, reader = load_gguf(source)
        chat_template = None
        if "tokenizer.chat_template" in reader.fields:
            chat_template = str(reader.fields["tokenizer.chat_template"].contents())
        save_hf_dir(tmp, config, state, dtype=dtype)
        Tokenizer.from_gguf(reader).save(tmp, chat_template=chat_template)
        marker = {**fingerprint, "files": _file_digests(tmp)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2), encoding="utf-8")
        _fsync_tree(tmp)
        if target.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=root))
            os.replace(target, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # A process that does not take the lock (an older version) finished first; keep
            # its result when it is the same conversion.
            if not is_converted(target, fingerprint):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
