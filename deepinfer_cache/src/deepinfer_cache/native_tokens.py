"""Python token lists to int32 in one C loop (``csrc/list_to_i32.c``), built on first use.

Why: a 77k-token Python list costs ~1 ms to convert with ``array("I", list)`` (~10 ns a token
of generic per-item work), more than hashing it. The C loop reads each exact int directly and
stops at the first item that is not a plain id in ``[0, 2**31 - 1]``; the caller then runs the
checked Python conversion, which accepts or rejects exactly as before (bools, int subclasses,
out-of-range ids, non-ints), so results and errors do not change.

Compiled like ``native_hash.py`` (same cache directory, ``$CC``), with this interpreter's
``Python.h``, and loaded with ``ctypes.PyDLL`` (the GIL stays held). Without a compiler or
headers, on a big-endian host, or with ``DEEPINFER_CACHE_NATIVE=0``, ``list_converter()`` is
None and ``array("I")`` does the work (one ``RuntimeWarning`` when the build fails).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import sysconfig
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .native_hash import NativeHashUnavailable, build_library, native_enabled

SOURCE = Path(__file__).parent / "csrc" / "list_to_i32.c"


def load_list_converter(
    build_dir: Path | None = None, cc: str | None = None
) -> Callable[[Any, int, int], np.ndarray | None]:
    """``convert(tokens, lo, hi)``: ``tokens[lo:hi]`` (a list or tuple) as a little-endian
    int32 array when every item there is an exact int in ``[0, 2**31 - 1]``, else None (the
    caller's checked path decides). Raises ``NativeHashUnavailable`` if it cannot be built."""
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        raise NativeHashUnavailable("no Python.h for this interpreter")
    if sys.byteorder != "little":
        raise NativeHashUnavailable("big-endian host")
    try:
        lib = ctypes.PyDLL(
            str(build_library(build_dir, cc, source=SOURCE, extra_flags=(f"-I{include}",)))
        )
    except OSError as exc:
        raise NativeHashUnavailable(f"cannot load {SOURCE.name}: {exc}") from exc
    fn = lib.dic_list_to_i32
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.py_object, ctypes.c_ssize_t, ctypes.c_ssize_t, ctypes.c_void_p]

    def convert(tokens: Any, lo: int, hi: int) -> np.ndarray | None:
        lo, hi, _ = slice(lo, hi).indices(len(tokens))
        out = np.empty(max(0, hi - lo), dtype="<i4")
        if fn(tokens, lo, out.size, out.__array_interface__["data"][0]) != -1:
            return None
        return out

    # Self-check: the C loop and the plain conversion agree, and odd items are handed back.
    probe = [0, 1, 7, 2**31 - 1, 123456]
    got = convert(probe, 1, 5)
    if got is None or got.tolist() != probe[1:] or convert([1, True], 0, 2) is not None:
        raise NativeHashUnavailable("the C token conversion disagrees with Python")
    if convert([1, -1], 0, 2) is not None or convert([2**31], 0, 1) is not None:
        raise NativeHashUnavailable("the C token conversion accepts out-of-range ids")
    return convert


@functools.cache
def list_converter() -> Callable[[Any, int, int], np.ndarray | None] | None:
    """The process's C list conversion, or None (``array("I")`` then); see the module doc."""
    if not native_enabled():
        return None
    try:
        return load_list_converter()
    except NativeHashUnavailable as exc:
        warnings.warn(
            f"deepinfer_cache: token lists convert with array('I') ({exc})",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
