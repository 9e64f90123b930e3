"""The xxh3_128 block-hash chain in one C call (``csrc/chain_hash.c``), built on first use.

Why: a 77k-token lookup at block size 64 chains 1203 XXH3-128 calls. From Python each costs a
slice, a concatenation, a call and an append (~0.4 us, ~0.45 ms a prompt), while hashing the
308 KB itself takes ~30 us. One C call per chunk of blocks removes the per-block Python.

The C file calls ``XXH3_128bits`` through a pointer taken from the ``xxhash`` module Python has
already loaded (else the system's ``libxxhash``), so it needs no xxHash headers and hashes with
the same code as the Python path. A self-check at load compares it with
``xxhash.xxh3_128_digest`` on a few blocks; any mismatch, missing compiler, missing symbol or
failed build means the pure-Python loop is used (one ``RuntimeWarning`` says why). Keys are
byte-identical either way (tested both ways).

Built with the system compiler (``$CC``, else ``cc``) into ``$DEEPINFER_CACHE_DIR/cache_native``
(default ``~/.cache/deepinfer/cache_native``), named by a key over the source, the flags and the
machine, written to a temporary file and renamed into place so concurrent processes never load
half a library. ``DEEPINFER_CACHE_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np
import xxhash

from .cache_root import cache_root

SOURCE = Path(__file__).parent / "csrc" / "chain_hash.c"
CFLAGS = ("-O2", "-shared", "-fPIC", "-std=c11")
COMPILE_TIMEOUT_S = 60
_SYMBOL = "XXH3_128bits"


class NativeHashUnavailable(RuntimeError):
    """The C chain could not be built, loaded or verified (the Python loop is used instead)."""


def default_build_dir() -> Path:
    """``$DEEPINFER_CACHE_DIR/cache_native``, else ``~/.cache/deepinfer/cache_native``."""
    return cache_root() / "cache_native"


def _library_name(cc: str, source: Path, flags: tuple[str, ...]) -> str:
    key = hashlib.sha256(
        source.read_bytes() + repr((flags, cc, platform.machine(), platform.system())).encode()
    ).hexdigest()[:16]
    return f"{source.stem}-{key}.so"


def build_library(
    build_dir: Path | None = None,
    cc: str | None = None,
    *,
    source: Path = SOURCE,
    extra_flags: tuple[str, ...] = (),
) -> Path:
    """The path of the compiled ``source`` (``chain_hash.c``), compiling it first if no build
    is cached. Raises ``NativeHashUnavailable`` when there is no compiler or the compile
    fails."""
    build_dir = default_build_dir() if build_dir is None else Path(build_dir)
    cc = cc or os.environ.get("CC") or "cc"
    flags = (*CFLAGS, *extra_flags)
    target = build_dir / _library_name(cc, source, flags)
    if target.exists():
        return target
    exe = shutil.which(cc)
    if exe is None:
        raise NativeHashUnavailable(f"no C compiler {cc!r} on PATH (set $CC)")
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=build_dir)
        os.close(fd)
    except OSError as exc:
        raise NativeHashUnavailable(f"cannot write to {build_dir}: {exc}") from exc
    try:
        proc = subprocess.run(
            [exe, *flags, "-o", tmp, str(source)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            raise NativeHashUnavailable(f"{cc} failed: {proc.stderr.strip()[:500]}")
        os.replace(tmp, target)  # atomic: another process sees the whole library or none
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeHashUnavailable(f"building {source.name} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def xxhash_libraries() -> list[str]:
    """Where xxHash's C functions can be found, in order: the ``xxhash`` package's extension,
    then the system ``libxxhash``."""
    candidates = []
    spec = importlib.util.find_spec("xxhash._xxhash")
    if spec is not None and spec.origin:
        candidates.append(spec.origin)
    system = ctypes.util.find_library("xxhash")
    if system:
        candidates.append(system)
    return candidates


def _xxh3_128_pointer() -> int:
    """The address of ``XXH3_128bits``: from the loaded ``xxhash`` extension, else the system
    ``libxxhash``."""
    candidates = xxhash_libraries()
    for path in candidates:
        try:
            fn = getattr(ctypes.CDLL(path), _SYMBOL)
        except (OSError, AttributeError):
            continue
        address = ctypes.cast(fn, ctypes.c_void_p).value
        if address:
            return int(address)
    raise NativeHashUnavailable(f"no {_SYMBOL} symbol in {candidates or 'any xxhash library'}")


class ChainHasher:
    """``hasher(root, blocks, n_blocks, block_bytes)``: the chained XXH3-128 digests of
    ``n_blocks`` blocks of ``block_bytes`` bytes from the buffer ``blocks``, chained from the
    16-byte ``root``, as a list of 16-byte ``bytes``."""

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))
        fn = self._lib.dic_chain_xxh3_128
        fn.restype = ctypes.c_int
        fn.argtypes = [  # fn, root, tokens, n_blocks, block_bytes, out (see chain_hash.c)
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
        ]
        self._fn = fn
        self._xxh3 = _xxh3_128_pointer()
        self._self_check()

    def __call__(
        self, root: bytes, blocks: memoryview, n_blocks: int, block_bytes: int
    ) -> list[bytes]:
        if len(root) != 16:
            raise ValueError(f"root must be 16 bytes, got {len(root)}")
        if n_blocks <= 0:
            return []
        if block_bytes <= 0 or len(blocks) < n_blocks * block_bytes:
            raise ValueError(
                f"blocks holds {len(blocks)} bytes, fewer than {n_blocks} x {block_bytes}"
            )
        src = np.frombuffer(blocks, dtype=np.uint8)  # no copy; read-only buffers pass too
        out = np.empty(16 * n_blocks, dtype=np.uint8)
        # Addresses via __array_interface__: ``ndarray.ctypes`` builds an object (~5 us).
        rc = self._fn(
            self._xxh3,
            root,
            src.__array_interface__["data"][0],
            n_blocks,
            block_bytes,
            out.__array_interface__["data"][0],
        )
        if rc != 0:  # only on malloc failure or a bad argument, both excluded above
            raise MemoryError("chain_hash: cannot allocate the message buffer")
        # 'V16' items come back as 16-byte bytes (not 'S16', which would strip trailing NULs).
        return out.view("V16").tolist()

    def _self_check(self) -> None:
        rng = np.random.default_rng(20)
        for block_bytes in (4, 256, 1000):
            blocks = rng.integers(0, 256, size=3 * block_bytes, dtype=np.uint8).tobytes()
            parent = root = hashlib.sha256(b"root").digest()[:16]
            want = []
            for i in range(3):
                parent = xxhash.xxh3_128_digest(
                    parent + blocks[i * block_bytes : (i + 1) * block_bytes]
                )
                want.append(parent)
            if self(root, memoryview(blocks), 3, block_bytes) != want:
                raise NativeHashUnavailable("the C chain disagrees with xxhash.xxh3_128_digest")


def load_chain_hasher(build_dir: Path | None = None, cc: str | None = None) -> ChainHasher:
    """Build (if needed), load and self-check the C chain; ``NativeHashUnavailable`` if not."""
    try:
        return ChainHasher(build_library(build_dir, cc))
    except OSError as exc:
        raise NativeHashUnavailable(f"cannot load the chain library: {exc}") from exc


def native_enabled() -> bool:
    """Whether the C helpers may be used: ``DEEPINFER_CACHE_NATIVE`` is not 0/false/no/off."""
    flag = os.environ.get("DEEPINFER_CACHE_NATIVE", "1").strip().lower()
    return flag not in ("0", "false", "no", "off")


@functools.cache
def chain_hasher() -> ChainHasher | None:
    """The process's C chain, or None (pure Python) when it is switched off
    (``DEEPINFER_CACHE_NATIVE=0``) or unavailable (warned once, with the reason)."""
    if not native_enabled():
        return None
    try:
        return load_chain_hasher()
    except NativeHashUnavailable as exc:
        warnings.warn(
            f"deepinfer_cache: block hashing uses the slower pure-Python loop ({exc})",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
