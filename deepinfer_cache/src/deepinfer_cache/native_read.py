"""A run of segment records read and hashed in one C call (``csrc/read_records.c``).

Why: ``SegmentDiskTier`` reads a run of consecutive records with ``preadv`` calls of about
256 KiB-1 MiB and hashes each payload piece right after its read. From Python that is, per
2 MiB record, eight slices, memoryviews, ``preadv`` calls and hasher updates with the GIL held
(about 0.1 s of CPU per GB read, ``benchmarks/results/cache.md``). One C call per run does the
same reads and the same streaming XXH3-64 with the GIL released, and can (``overlap``) make
the reads on a second thread while the calling one hashes; the caller still checks every record
header and compares every digest, so what counts as a valid record does not change.

The C file calls xxHash's streaming XXH3-64 functions through pointers taken from the
``xxhash`` extension Python has already loaded (else the system ``libxxhash``), so the digests
are those of ``xxhash.xxh3_64`` by construction; a self-check at load reads a small file both
ways. Built and cached like ``native_hash.py`` (``$CC``, ``$DEEPINFER_CACHE_DIR``); without a
compiler, with a failed self-check or with ``DEEPINFER_CACHE_NATIVE=0``, ``record_reader()`` is
None and the tier reads in Python (one ``RuntimeWarning`` says why).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xxhash

from .native_hash import NativeHashUnavailable, build_library, native_enabled, xxhash_libraries

SOURCE = Path(__file__).parent / "csrc" / "read_records.c"
# Each entry: the names to try, best first. The ``xxhash`` wheel exports its runtime
# dispatcher (AVX2/AVX-512 when the CPU has them) as ``XXH3_64bits_update_dispatch``; the plain
# ``XXH3_64bits_update`` there is the SSE2 build, ~2x slower per byte (measured: the update was
# 19% of a cold read's CPU with it). The state layout is the same for both.
_STATE_FUNCTIONS = (
    ("XXH3_createState",),
    ("XXH3_freeState",),
    ("XXH3_64bits_reset",),
    ("XXH3_64bits_update_dispatch", "XXH3_64bits_update"),
    ("XXH3_64bits_digest",),
)


class _Fns(ctypes.Structure):
    # Mirrors dic_xxh3_fns in read_records.c: five function pointers, in this order.
    _fields_ = [(names[-1], ctypes.c_void_p) for names in _STATE_FUNCTIONS]


def _address(lib: ctypes.CDLL, names: tuple[str, ...]) -> int | None:
    for name in names:
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue
        return ctypes.cast(fn, ctypes.c_void_p).value
    return None


def _xxh3_state_functions() -> _Fns:
    """The addresses of xxHash's streaming XXH3-64 functions: from the loaded ``xxhash``
    extension, else the system ``libxxhash``."""
    candidates = xxhash_libraries()
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        addresses = [_address(lib, names) for names in _STATE_FUNCTIONS]
        if all(addresses):
            return _Fns(*addresses)
    raise NativeHashUnavailable(f"no streaming XXH3 functions in {candidates or 'any library'}")


class RecordReader:
    """``reader(fd, offset, n, slot_bytes, head_bytes, dests, heads, piece_bytes, hot_bytes)``
    reads ``n`` records in consecutive slots from ``offset`` of ``fd``: headers into ``heads``
    (``n * head_bytes`` bytes, writable), payloads into ``dests`` (``n`` writable buffers of
    the payload size each). Returns ``(done, digests, error)``: per record, whether it was
    read whole and the XXH3-64 of its payload (meaningful only where done), and the
    ``OSError`` of a failed read or None (records read before it are still reported done)."""

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))  # CDLL: the GIL is released during each call
        fn = self._lib.dic_read_records
        fn.restype = ctypes.c_int
        fn.argtypes = [  # see read_records.c
            ctypes.c_void_p,  # fns
            ctypes.c_int,  # fd
            ctypes.c_int64,  # offset
            ctypes.c_int64,  # n
            ctypes.c_int64,  # slot_bytes
            ctypes.c_int64,  # head_bytes
            ctypes.c_int64,  # page_bytes
            ctypes.c_int64,  # piece_bytes
            ctypes.c_int64,  # hot_bytes
            ctypes.c_void_p,  # heads
            ctypes.c_void_p,  # dests (array of pointers)
            ctypes.c_void_p,  # digests
            ctypes.c_void_p,  # done
            ctypes.c_int,  # overlap
            ctypes.c_int,  # direct
        ]
        self._fn = fn
        self._fns = _xxh3_state_functions()
        self._fns_address = ctypes.addressof(self._fns)
        self._self_check()

    def __call__(
        self,
        fd: int,
        offset: int,
        slot_bytes: int,
        head_bytes: int,
        dests: Sequence[int],
        page_bytes: int,
        heads: np.ndarray,
        piece_bytes: int,
        hot_bytes: int,
        overlap: bool | int = False,
        direct: bool = False,
    ) -> tuple[list[bool], list[int], OSError | None]:
        """``dests``: the payload buffers' addresses (each ``page_bytes`` writable bytes that
        stay alive during the call); ``heads``: a writable uint8 array of ``n * head_bytes``;
        ``overlap``: when the run takes more than one read, that many threads (True: one,
        at most 4) make the reads while this one hashes (the results are the same either
        way); ``direct``: each slot is read whole
        into a frame of ``slot_bytes`` writable bytes starting ``head_bytes`` before its dest
        (for an ``O_DIRECT`` descriptor: the caller aligns the frames and the offset), and a
        short read ends the run."""
        n = len(dests)
        if heads.dtype != np.uint8 or heads.size < n * head_bytes or not heads.flags.writeable:
            raise ValueError(f"heads must be a writable uint8 array of {n * head_bytes} bytes")
        if not heads.flags.c_contiguous:
            raise ValueError("heads must be contiguous")
        ptrs = np.asarray(dests, dtype=np.uintp)
        digests = np.zeros(n, dtype=np.uint64)
        done = np.zeros(n, dtype=np.uint8)
        rc = self._fn(
            self._fns_address,
            fd,
            offset,
            n,
            slot_bytes,
            head_bytes,
            page_bytes,
            piece_bytes,
            hot_bytes,
            heads.__array_interface__["data"][0],
            ptrs.__array_interface__["data"][0],
            digests.__array_interface__["data"][0],
            done.__array_interface__["data"][0],
            int(overlap),
            int(direct),
        )
        if rc == -1:
            raise ValueError("read_records: unusable arguments or out of memory")
        error = OSError(-rc, os.strerror(-rc)) if rc < 0 else None
        return done.astype(bool).tolist(), digests.tolist(), error

    def _self_check(self) -> None:
        """Read a small file of three records both ways (C and ``xxhash``) and compare,
        with pieces and batches smaller than a record and a file that ends inside the last."""
        rng = np.random.default_rng(20)
        head, page, slot = 8, 1000, 1100
        data = rng.integers(0, 256, size=2 * slot + head + page - 50, dtype=np.uint8)
        with tempfile.TemporaryFile() as f:
            f.write(data.tobytes())
            f.flush()
            cases = ((256, 512, True), (256, 512, False), (4096, 1 << 20, True))
            for (piece, hot, overlap), direct in itertools.product(cases, (False, True)):
                # direct: frames of a slot each, the page head bytes into its frame
                frames = [np.empty(slot, dtype=np.uint8) for _ in range(3)]
                pages = [fr[head : head + page] if direct else fr[:page] for fr in frames]
                heads = np.empty(3 * head, dtype=np.uint8)
                done, digests, error = self(
                    f.fileno(),
                    0,
                    slot,
                    head,
                    [p.__array_interface__["data"][0] for p in pages],
                    page,
                    heads,
                    piece,
                    hot,
                    overlap,
                    direct,
                )
                if error is not None:
                    raise NativeHashUnavailable(f"the C record reader failed: {error}")
                for i in range(2):
                    body = data[i * slot + head : i * slot + head + page]
                    ok = (
                        done[i]
                        and digests[i] == xxhash.xxh3_64_intdigest(body.tobytes())
                        and np.array_equal(pages[i], body)
                        and np.array_equal(
                            heads[i * head : (i + 1) * head], data[i * slot : i * slot + head]
                        )
                    )
                    if not ok:
                        raise NativeHashUnavailable("the C record reader disagrees with xxhash")
                if done[2]:
                    raise NativeHashUnavailable("the C record reader passed a truncated record")


def load_record_reader(build_dir: Path | None = None, cc: str | None = None) -> RecordReader:
    """Build (if needed), load and self-check the C reader; ``NativeHashUnavailable`` if not."""
    try:
        return RecordReader(build_library(build_dir, cc, source=SOURCE, extra_flags=("-pthread",)))
    except OSError as exc:
        raise NativeHashUnavailable(f"cannot load the record reader: {exc}") from exc


@functools.cache
def record_reader() -> RecordReader | None:
    """The process's C record reader, or None (the tier reads in Python) when it is switched
    off (``DEEPINFER_CACHE_NATIVE=0``) or unavailable (warned once, with the reason)."""
    if not native_enabled():
        return None
    try:
        return load_record_reader()
    except NativeHashUnavailable as exc:
        warnings.warn(
            f"deepinfer_cache: segment reads use the slower pure-Python loop ({exc})",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
