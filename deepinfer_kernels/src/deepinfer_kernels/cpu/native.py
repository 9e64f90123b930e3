"""Compile a C source into a shared library once, cache it, load it (CPU kernels).

Triton does the same for its launchers: the machine's C compiler (``$CC``, else ``cc``) builds
the library on first use, with ``-march=native``, into ``$DEEPINFER_CACHE_DIR/kernels/``
(default ``~/.cache/deepinfer/kernels``). The file name carries a key over everything the
binary depends on (the source and the files it ``#include "..."``s, the compiler's version, the
flags, the CPU's feature flags, the OpenMP runtime it links), so a changed source, compiler or
machine gets a new build and a stale one is never loaded. Builds are written to a
temporary file and renamed into place under a lock, so concurrent processes build once and no
process sees half a library.

OpenMP: the library links the OpenMP runtime this process already has loaded (torch's), so its
parallel loops run on torch's thread pool, sized by ``torch.set_num_threads``, instead of
starting a second pool that would fight it for the cores. Without one, it is built without
OpenMP (one thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

COMPILE_TIMEOUT_S = 120


def default_cache_dir() -> Path:
    """``$DEEPINFER_CACHE_DIR/kernels``, else ``~/.cache/deepinfer/kernels``."""
    env = os.environ.get("DEEPINFER_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "deepinfer") / "kernels"


@contextlib.contextmanager
def exclusive_lock(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing; a no-op where
    ``fcntl`` is absent): processes filling one cache entry take turns."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(lock_file, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class NativeBuildError(RuntimeError):
    """The library could not be built or loaded (no compiler, a compile error, ...)."""


def find_compiler() -> str:
    """``$CC``, else ``cc``/``gcc``/``clang`` on ``PATH``."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and (path := shutil.which(name)):
            return path
    raise NativeBuildError("no C compiler found: install one or point $CC at it")


def compiler_available() -> bool:
    """Whether :func:`find_compiler` finds a C compiler."""
    try:
        find_compiler()
    except NativeBuildError:
        return False
    return True


def loaded_openmp_runtime() -> Path | None:
    """The GNU OpenMP runtime file mapped into this process (Linux), if any."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            for line in fh:
                path = line.rsplit(" ", 1)[-1].strip()
                if Path(path).name.startswith("libgomp") and Path(path).is_file():
                    return Path(path)
    except OSError:
        return None
    return None


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _compile_flags() -> list[str]:
    flags = ["-O3", "-std=gnu11", "-fPIC", "-march=native"]
    if platform.machine() in ("x86_64", "AMD64"):
        # gcc picks 256-bit vectors for -march=native on AVX-512 parts; the kernels are
        # written for 512-bit ones.
        flags.append("-mprefer-vector-width=512")
    return flags


def _compiler_version(compiler: str) -> str:
    try:
        out = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"cannot run the C compiler {compiler!r}: {exc}") from exc
    return out.stdout.splitlines()[0] if out.stdout else compiler


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"{cmd[0]} failed to run: {exc}") from exc
    if done.returncode != 0:
        raise NativeBuildError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()[-2000:]}")


_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def source_digest(source: Path) -> str:
    """SHA-256 over ``source`` and, recursively, the files it ``#include "..."``s from its own
    directory tree, so that editing an included file gives a new build key."""
    digest = hashlib.sha256()
    seen: set[Path] = set()
    pending = [source.resolve()]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        text = path.read_bytes()
        digest.update(str(len(text)).encode() + b"\0" + text)
        for name in _LOCAL_INCLUDE.findall(text):
            included = path.parent / name.decode()
            if included.is_file():
                pending.append(included.resolve())
    return digest.hexdigest()


def build_library(source: Path, cache_dir: Path | None = None) -> Path:
    """Path of the shared library built from the C file ``source``, building it if needed.

    ``cache_dir`` defaults to :func:`default_cache_dir`. Raises :class:`NativeBuildError` when
    this machine cannot build it.
    """
    if sys.byteorder != "little":
        raise NativeBuildError("the CPU kernels assume a little-endian machine")
    compiler = find_compiler()
    openmp = loaded_openmp_runtime()
    flags = _compile_flags()
    key_parts = [
        source_digest(source),
        _compiler_version(compiler),
        " ".join(flags),
        _cpu_flags(),
        str(openmp),
    ]
    key = hashlib.sha256("\n".join(key_parts).encode()).hexdigest()[:16]
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / f"{source.stem}-{key}.so"
    if target.is_file():
        return target
    try:
        return _build_into(root, target, source, compiler, flags, openmp)
    except OSError as exc:  # an unwritable or full cache directory
        raise NativeBuildError(f"cannot build into {root}: {exc}") from exc


def _build_into(
    root: Path, target: Path, source: Path, compiler: str, flags: list[str], openmp: Path | None
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{source.stem}.lock"):
        if target.is_file():  # another process built it while this one waited
            return target
        with tempfile.TemporaryDirectory(prefix=f".{source.stem}-", dir=root) as tmp:
            obj, lib = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
            compile_cmd = [compiler, *flags, "-c", str(source), "-o", str(obj)]
            link_cmd = [compiler, "-shared", str(obj), "-o", str(lib)]
            if openmp is not None:
                compile_cmd.insert(1, "-fopenmp")
                # Link the runtime file itself (not -fopenmp's -lgomp, which may be another
                # copy), found at run time through the rpath.
                link_cmd += [str(openmp), f"-Wl,-rpath,{openmp.parent}"]
            _run(compile_cmd)
            _run(link_cmd)
            os.replace(lib, target)
    return target


def load_library(source: Path, cache_dir: Path | None = None) -> ctypes.CDLL:
    """Build (if needed) and load the C file ``source``."""
    path = build_library(source, cache_dir)
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        # A damaged file under the final name (a disk error: builds are renamed into place
        # whole) is removed, so the next call rebuilds it.
        path.unlink(missing_ok=True)
        raise NativeBuildError(f"cannot load {path}: {exc}") from exc


class NativeFunction:
    """One C function of the file ``source``, built and loaded on the first :meth:`available`.

    ``enabled=None`` reads ``DEEPINFER_CPU_KERNELS`` (``0`` turns every compiled kernel off).
    When the build fails, :meth:`available` warns once and from then on answers False (the
    reason is kept in :attr:`error`), so callers fall back to torch.
    """

    def __init__(
        self,
        source: Path,
        symbol: str,
        argtypes: list[Any],
        *,
        restype: Any = None,
        cache_dir: Path | None = None,
        enabled: bool | None = None,
    ) -> None:
        if enabled is None:
            enabled = os.environ.get("DEEPINFER_CPU_KERNELS", "1") != "0"
        self.source, self.symbol = source, symbol
        self.argtypes, self.restype = argtypes, restype
        self.cache_dir = cache_dir
        self.enabled = enabled
        self.error: str | None = None
        self._fn: Callable[..., Any] | None = None

    def available(self) -> bool:
        """Whether the function can run here (builds it on the first call)."""
        if not self.enabled:
            return False
        if self._fn is None and self.error is None:
            try:
                fn = getattr(load_library(self.source, self.cache_dir), self.symbol)
            except (NativeBuildError, AttributeError, OSError) as exc:
                self.error = str(exc)
                warnings.warn(
                    f"deepinfer's CPU kernel {self.symbol} is unavailable, using torch: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return False
            fn.argtypes = self.argtypes
            fn.restype = self.restype
            self._fn = fn
        return self._fn is not None

    def __call__(self, *args: Any) -> Any:
        if not self.available() or self._fn is None:
            raise RuntimeError(f"{self.symbol} is unavailable: {self.error or 'turned off'}")
        return self._fn(*args)
