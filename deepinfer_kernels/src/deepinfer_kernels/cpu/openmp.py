"""The OpenMP runtime for a process without torch (the lean CPU runtime).

:func:`~deepinfer_kernels.cpu.build.build_library` links each kernel against the OpenMP runtime
the process already has loaded, so its parallel loops share torch's thread pool; with none
loaded it builds a one-thread library. A process that never imports torch loads the runtime
first with :func:`load_openmp_runtime`: torch's own ``libgomp`` when torch is installed (found
on disk, not imported; the libraries then have the engine's build key and are the same files),
else the C compiler's. :func:`set_num_threads` sizes its pool, as ``torch.set_num_threads``
does the engine's; ``OMP_NUM_THREADS`` is read by the runtime itself.

Example::

    from deepinfer_kernels.cpu.openmp import load_openmp_runtime, set_num_threads

    load_openmp_runtime()  # before the first kernel is built or loaded
    set_num_threads(2)
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import subprocess
from pathlib import Path

from deepinfer_kernels.cpu.build import find_compiler, loaded_openmp_runtime


def _torch_libgomp() -> Path | None:
    """torch's bundled ``libgomp`` (located through the import system, never imported)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "lib"
    found = sorted(lib.glob("libgomp*.so*")) if lib.is_dir() else []
    return found[0] if found else None


def _compiler_libgomp() -> Path | None:
    """The C compiler's ``libgomp`` (``cc -print-file-name=libgomp.so``), if it has one."""
    try:
        out = subprocess.run(
            [find_compiler(), "-print-file-name=libgomp.so"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return None
    path = Path(out.stdout.strip())
    return path.resolve() if path.is_absolute() and path.exists() else None


@functools.cache
def load_openmp_runtime() -> Path | None:
    """Load an OpenMP runtime into this process (once; see the module doc) and return its
    file, or None where there is none (the kernels then build single-threaded)."""
    loaded = loaded_openmp_runtime()
    if loaded is not None:
        return loaded
    for candidate in (_torch_libgomp(), _compiler_libgomp()):
        if candidate is None:
            continue
        try:
            ctypes.CDLL(os.fspath(candidate), mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return loaded_openmp_runtime() or candidate
    return None


def set_num_threads(threads: int) -> None:
    """Size the loaded OpenMP runtime's thread pool (``threads >= 1``); a no-op without one."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads: expected an int >= 1, got {threads!r}")
    runtime = load_openmp_runtime()
    if runtime is None:
        return
    fn = ctypes.CDLL(os.fspath(runtime)).omp_set_num_threads
    fn.argtypes, fn.restype = [ctypes.c_int], None
    fn(threads)
