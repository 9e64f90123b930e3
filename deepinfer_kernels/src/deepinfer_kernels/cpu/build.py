"""Compile a C source into a shared library once, cache it (CPU kernels).

Triton does the same for its launchers: the machine's C compiler (``$CC``, else ``cc``) builds
the library on first use, with ``-march=native``, into ``$DEEPINFER_CACHE_DIR/kernels/``
(default ``~/.cache/deepinfer/kernels``). The file name carries a key over everything the
binary depends on (the source and the files it ``#include "..."``s, the compiler's version, the
flags, the CPU's feature flags, the OpenMP runtime it links), so a changed source, compiler or
machine gets a new build and a stale one is never loaded. Builds are written to a
temporary file and renamed into place under a lock, so concurrent processes build once and no
process sees half a library.

Ahead of time: ``make kernels`` (``python -m deepinfer_kernels.cpu.aot``) builds every kernel
into the package's ``prebuilt/`` directory (or ``<cache>/prebuilt``), named by a key that leaves
out the compiler (the machine that loads it may have none) but keeps the source, flags, CPU
features and OpenMP runtime. :func:`build_library` looks there first and runs no compiler when
it finds its file.

A compile that fails leaves a ``.failed`` file under the build key beside the cache entry:
later processes with the same source, compiler, flags and machine read the reason from it
instead of compiling again (delete it to retry).

OpenMP: the library links the OpenMP runtime this process already has loaded (torch's), so its
parallel loops run on torch's thread pool, sized by ``torch.set_num_threads``, instead of
starting a second pool that would fight it for the cores. Without one, it is built without
OpenMP (one thread).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

COMPILE_TIMEOUT_S = 120
PACKAGE_PREBUILT_DIR = Path(__file__).parent / "prebuilt"


def default_cache_dir() -> Path:
    """``$DEEPINFER_CACHE_DIR/kernels``, else ``~/.cache/deepinfer/kernels``."""
    env = os.environ.get("DEEPINFER_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "deepinfer") / "kernels"


def prebuilt_dirs(cache_dir: Path | None = None) -> list[Path]:
    """Where :func:`build_library` looks for ahead-of-time builds: ``<cache_dir>/prebuilt``
    when ``cache_dir`` is given, else the package's ``prebuilt/`` and the default cache's."""
    if cache_dir is not None:
        return [cache_dir / "prebuilt"]
    return [PACKAGE_PREBUILT_DIR, default_cache_dir() / "prebuilt"]


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


class CompileError(NativeBuildError):
    """The compiler ran and refused the source (remembered on disk: see the module doc)."""


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


def compile_flags() -> list[str]:
    """The flags every kernel is compiled with (part of the build key)."""
    flags = ["-O3", "-std=gnu11", "-fPIC", "-march=native"]
    if platform.machine() in ("x86_64", "AMD64"):
        # gcc picks 256-bit vectors for -march=native on AVX-512 parts; the kernels are
        # written for 512-bit ones.
        flags.append("-mprefer-vector-width=512")
    return flags


@functools.lru_cache(maxsize=8)
def compiler_version(compiler: str) -> str:
    """The first line of ``compiler --version``, run once per compiler path and process
    (every kernel's build key needs it; a start used to run it once per kernel)."""
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
        raise CompileError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()[-2000:]}")


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


def _key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def prebuilt_name(source: Path) -> str:
    """File name of ``source``'s ahead-of-time build on this machine: keyed on the source,
    flags, CPU features and OpenMP runtime, not the compiler (none is needed to load it)."""
    openmp = loaded_openmp_runtime()
    key = _key(source_digest(source), " ".join(compile_flags()), _cpu_flags(), str(openmp))
    return f"{source.stem}-aot-{key}.so"


def build_library(source: Path, cache_dir: Path | None = None) -> Path:
    """Path of the shared library built from the C file ``source``, building it if needed.

    An ahead-of-time build for this machine (:func:`prebuilt_dirs`) is used as it is. Else
    ``cache_dir`` (default :func:`default_cache_dir`) holds the runtime build. Raises
    :class:`NativeBuildError` when this machine cannot build it, without compiling again when
    an earlier process's compile of the same key failed.
    """
    if sys.byteorder != "little":
        raise NativeBuildError("the CPU kernels assume a little-endian machine")
    name = prebuilt_name(source)
    for folder in prebuilt_dirs(cache_dir):
        if (folder / name).is_file():
            return folder / name
    compiler = find_compiler()
    openmp = loaded_openmp_runtime()
    flags = compile_flags()
    key = _key(
        source_digest(source),
        compiler_version(compiler),
        " ".join(flags),
        _cpu_flags(),
        str(openmp),
    )
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / f"{source.stem}-{key}.so"
    if target.is_file():
        return target
    failed = target.with_suffix(".failed")
    if failed.is_file():
        raise CompileError(
            f"an earlier build of {source.name} with this compiler failed (delete {failed} to "
            f"retry): {failed.read_text(errors='replace')[-2000:]}"
        )
    try:
        return _build_into(root, target, source, compiler, flags, openmp)
    except CompileError as exc:
        with contextlib.suppress(OSError):
            failed.write_text(str(exc))
        raise
    except OSError as exc:  # an unwritable or full cache directory
        raise NativeBuildError(f"cannot build into {root}: {exc}") from exc


def build_prebuilt(source: Path, into: Path) -> Path:
    """Build ``source`` ahead of time into ``into`` under :func:`prebuilt_name` (the
    ``make kernels`` step); a build already there is kept."""
    target = into / prebuilt_name(source)
    if target.is_file():
        return target
    try:
        return _build_into(
            into, target, source, find_compiler(), compile_flags(), loaded_openmp_runtime()
        )
    except OSError as exc:
        raise NativeBuildError(f"cannot build into {into}: {exc}") from exc


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
