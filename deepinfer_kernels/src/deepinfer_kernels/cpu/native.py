"""Load the compiled CPU kernels: once per process, checked, with one warning when they cannot be.

:mod:`deepinfer_kernels.cpu.build` builds a C file into a shared library (ahead of time or on
first use); this module loads it and hands out its functions:

* :func:`load_library` remembers each library and each failure per ``(source, cache_dir)``
  for the life of the process, so several functions of one file, or of files that fail for one
  reason, cost one build attempt, and a failed build is not retried for every symbol;
* :class:`NativeFunction` is one C function: built on its first :meth:`~NativeFunction.available`,
  typed from the signature table (:mod:`deepinfer_kernels.cpu.sources`) whose ABI string the
  library must export (:class:`~deepinfer_kernels.cpu.abi.NativeAbiError` otherwise, raised, not
  warned: a mismatch is a bug, never a reason to run), and falling back (``available()`` False)
  with one :class:`RuntimeWarning` per distinct reason and cache directory per process, so a
  machine without a compiler warns once, not once per kernel.

``DEEPINFER_CPU_KERNELS=0`` turns every compiled kernel off.

The build API (:func:`build_library`, :func:`find_compiler`, ...) is re-exported here: this
module is the one other packages' C sources build through.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deepinfer_kernels.cpu.abi import CSignature, CSource, NativeAbiError
from deepinfer_kernels.cpu.build import (
    COMPILE_TIMEOUT_S,
    CompileError,
    NativeBuildError,
    build_library,
    build_prebuilt,
    compiler_available,
    compiler_version,
    default_cache_dir,
    exclusive_lock,
    find_compiler,
    loaded_openmp_runtime,
    prebuilt_dirs,
    source_digest,
)

__all__ = [
    "COMPILE_TIMEOUT_S",
    "CSignature",
    "CSource",
    "CompileError",
    "LoadedLibraries",
    "NativeAbiError",
    "NativeBuildError",
    "NativeFunction",
    "build_library",
    "build_prebuilt",
    "compiler_available",
    "compiler_version",
    "default_cache_dir",
    "exclusive_lock",
    "find_compiler",
    "load_library",
    "loaded_libraries",
    "loaded_openmp_runtime",
    "prebuilt_dirs",
    "source_digest",
]

ENV_SWITCH = "DEEPINFER_CPU_KERNELS"


class LoadedLibraries:
    """What this process loaded, or failed to, per ``(source, cache_dir)``, and the warnings
    it gave (see the module doc). One per process: :func:`loaded_libraries`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple[Path, Path | None], ctypes.CDLL | Exception] = {}
        self._warned: set[tuple[Path | None, str]] = set()

    def load(
        self, source: Path, cache_dir: Path | None = None, abi: CSource | None = None
    ) -> ctypes.CDLL:
        key = (source.resolve(), cache_dir)
        with self._lock:
            done = self._done.get(key)
            if done is None:
                try:
                    done = _load(source, cache_dir, abi)
                except (NativeBuildError, NativeAbiError) as exc:
                    done = exc
                self._done[key] = done
        if isinstance(done, Exception):
            raise done
        return done

    def warn_once(self, cache_dir: Path | None, reason: str) -> None:
        """One ``RuntimeWarning`` per reason and cache directory."""
        with self._lock:
            if (cache_dir, reason) in self._warned:
                return
            self._warned.add((cache_dir, reason))
        warnings.warn(
            f"deepinfer's compiled CPU kernels are unavailable, using torch: {reason}",
            RuntimeWarning,
            stacklevel=4,
        )


@functools.cache
def loaded_libraries() -> LoadedLibraries:
    """This process's :class:`LoadedLibraries` (the state is per process by design: a failed
    build is remembered, and warned about, once)."""
    return LoadedLibraries()


def _load(source: Path, cache_dir: Path | None, abi: CSource | None) -> ctypes.CDLL:
    path = build_library(source, cache_dir)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        # A damaged file under the final name (a disk error: builds are renamed into place
        # whole) is removed, so the next process rebuilds it.
        path.unlink(missing_ok=True)
        raise NativeBuildError(f"cannot load {path}: {exc}") from exc
    if abi is not None:
        abi.check(lib)
    return lib


def load_library(source: Path | CSource, cache_dir: Path | None = None) -> ctypes.CDLL:
    """Build (if needed) and load the C file ``source``, once per process (a
    :class:`CSource` is also checked against its ABI string)."""
    if isinstance(source, CSource):
        return loaded_libraries().load(source.path, cache_dir, source)
    return loaded_libraries().load(source, cache_dir)


class NativeFunction:
    """One C function of the file ``source``, built and loaded on the first :meth:`available`.

    ``source``: a :class:`CSource` from the signature table (its types come from there), or a
    plain path with explicit ``argtypes``/``restype``. ``enabled=None`` reads
    ``DEEPINFER_CPU_KERNELS`` (``0`` turns every compiled kernel off). When the build fails,
    :meth:`available` answers False from then on (the reason is kept in :attr:`error`) and the
    process warns once per reason, so callers fall back to torch. A library whose ABI differs
    from the table raises :class:`NativeAbiError`.
    """

    def __init__(
        self,
        source: Path | CSource,
        symbol: str,
        argtypes: list[Any] | None = None,
        *,
        restype: Any = None,
        cache_dir: Path | None = None,
        enabled: bool | None = None,
    ) -> None:
        if isinstance(source, CSource):
            sig = source.signature(symbol)
            if argtypes is not None and list(argtypes) != sig.argtypes:
                raise ValueError(f"argtypes: {symbol} is declared {sig.declaration()}")
            argtypes, restype = sig.argtypes, sig.restype
            self.abi: CSource | None = source
            self.source = source.path
        else:
            if argtypes is None:
                raise ValueError("argtypes: required for a source outside the signature table")
            self.abi, self.source = None, source
        if enabled is None:
            enabled = os.environ.get(ENV_SWITCH, "1") != "0"
        self.symbol = symbol
        self.argtypes, self.restype = list(argtypes), restype
        self.cache_dir = cache_dir
        self.enabled = enabled
        self.error: str | None = None
        self._fn: Callable[..., Any] | None = None

    def available(self) -> bool:
        """Whether the function can run here (builds it on the first call)."""
        if not self.enabled:
            return False
        if self._fn is None and self.error is None:
            libs = loaded_libraries()
            try:
                lib = libs.load(self.source, self.cache_dir, self.abi)
                fn = getattr(lib, self.symbol)
            except (NativeBuildError, AttributeError) as exc:
                self.error = str(exc)
                libs.warn_once(self.cache_dir, self.error)
                return False
            fn.argtypes = self.argtypes
            fn.restype = self.restype
            self._fn = fn
        return self._fn is not None

    def __call__(self, *args: Any) -> Any:
        fn = self._fn
        if fn is None:
            if not self.available() or self._fn is None:
                raise RuntimeError(f"{self.symbol} is unavailable: {self.error or 'turned off'}")
            fn = self._fn
        if len(args) != len(self.argtypes):
            # ctypes passes surplus arguments through unchecked: refuse them here.
            raise TypeError(f"{self.symbol} takes {len(self.argtypes)} arguments, got {len(args)}")
        return fn(*args)
