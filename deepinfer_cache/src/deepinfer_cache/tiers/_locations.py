"""Where each durable record of a segment tier lives: ``key -> Rec``, loaded without a Python
object per record.

A reopen of a million blocks used to build a million 7-tuples and a dict of them from the
manifest (and the cyclic collector then walked every tuple once): most of the tier's reopen
time. ``LocationTable`` keeps the manifest's numpy rows as they were read and one
``key -> row`` dict built in a single call; a record becomes a tuple only when something asks
for it (a read, a touch, a compaction), and stays that tuple from then on, so callers can
still compare what they got with ``is`` to detect a change made meanwhile. Records written or
changed after the open live in a plain dict. A key is in exactly one of the two maps.

The table's own lock makes moving a record from the rows to the dict atomic with respect to
deletes and overwrites; the tier's lock still orders everything else, as with a dict.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..segment_format import MANIFEST_DTYPE

# (segment, slot, parent, tenant, retention, expires_at, payload xxh3): one live record.
Rec = tuple[int, int, bytes | None, bytes | None, str, float, int]

_ZERO16 = bytes(16)


class LocationTable:
    """A dict-like ``key -> Rec`` (``get``, ``[]``, ``in``, ``pop``, ``del``, ``len``, iteration
    over keys) over manifest rows plus records changed since."""

    def __init__(
        self,
        rows: np.ndarray | None = None,
        classes: list[str] | None = None,
        pos: dict[bytes, int] | None = None,
    ) -> None:
        self._rows = rows if rows is not None else np.zeros(0, dtype=MANIFEST_DTYPE)
        self._classes = list(classes or ())
        self._pos: dict[bytes, int] = pos if pos is not None else {}  # still in ``_rows``
        self._over: dict[bytes, Rec] = {}  # materialised or written since the open
        self._mu = threading.Lock()

    def _rec(self, i: int) -> Rec:
        r = self._rows[i]
        flags = int(r["flags"])
        return (
            int(r["segment"]),
            int(r["slot"]),
            r["parent"].tobytes() if flags & 1 else None,
            r["tenant"].tobytes() if flags & 2 else None,
            self._classes[int(r["cls"])],
            float(r["expires"]),
            int(r["xxh3"]),
        )

    # ------------------------------------------------------------------ mapping
    def get(self, key: bytes, default: Any = None) -> Any:
        r = self._over.get(key)
        if r is not None:
            return r
        if key not in self._pos:
            r = self._over.get(key)  # moved over meanwhile
            return default if r is None else r
        with self._mu:
            r = self._over.get(key)
            if r is not None:
                return r
            i = self._pos.get(key)
            if i is None:
                return default
            r = self._rec(i)
            self._over[key] = r  # first in the dict, then out of the rows: never in neither
            del self._pos[key]
            return r

    def __getitem__(self, key: bytes) -> Rec:
        r = self.get(key)
        if r is None:
            raise KeyError(key)
        return r  # type: ignore[no-any-return]

    def __setitem__(self, key: bytes, rec: Rec) -> None:
        with self._mu:
            self._over[key] = rec
            self._pos.pop(key, None)

    def pop(self, key: bytes, default: Any = None) -> Any:
        with self._mu:
            r = self._over.pop(key, None)
            i = self._pos.pop(key, None)
            if r is None and i is not None:
                r = self._rec(i)
        return default if r is None else r

    def __delitem__(self, key: bytes) -> None:
        if self.pop(key) is None:
            raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in self._over or key in self._pos

    def __len__(self) -> int:
        return len(self._over) + len(self._pos)

    def __iter__(self) -> Iterator[bytes]:
        with self._mu:
            keys = list(self._pos) + list(self._over)
        return iter(keys)

    # ------------------------------------------------------------------ bulk views
    def in_segment(self, segment: int) -> list[tuple[bytes, Rec]]:
        """The records in ``segment`` (each materialised, so ``is`` checks hold later)."""
        with self._mu:
            over = [(k, r) for k, r in self._over.items() if r[0] == segment]
            rows = self._rows
            hit = np.flatnonzero(rows["segment"] == segment).tolist()
            keys = [rows["key"][i].tobytes() for i in hit]
            base = [k for k, i in zip(keys, hit) if self._pos.get(k) == i]
        return over + [(k, r) for k in base if (r := self.get(k)) is not None]

    def live_per_segment(self) -> dict[int, int]:
        with self._mu:
            idx = np.fromiter(self._pos.values(), dtype=np.int64, count=len(self._pos))
            over = [r[0] for r in self._over.values()]
        segs = np.concatenate(
            [self._rows["segment"][idx].astype(np.int64), np.array(over, np.int64)]
        )
        u, n = np.unique(segs, return_counts=True)
        return dict(zip(u.tolist(), n.tolist()))

    def snapshot(self) -> tuple[np.ndarray, list[tuple[bytes, Rec]]]:
        """What ``manifest_rows`` needs, taken at once (call it under the tier's lock)."""
        with self._mu:
            return (
                np.fromiter(self._pos.values(), dtype=np.int64, count=len(self._pos)),
                list(self._over.items()),
            )

    def manifest_rows(
        self, snap: tuple[np.ndarray, list[tuple[bytes, Rec]]]
    ) -> tuple[np.ndarray, list[str]]:
        """Every record of ``snap`` as ``MANIFEST_DTYPE`` rows and their class names: the rows
        still as read are copied column-wise, only records changed since become rows one by
        one."""
        idx, items = snap
        base = self._rows[idx]
        classes = sorted(
            {self._classes[c] for c in np.unique(base["cls"]).tolist()} | {r[4] for _, r in items}
        )
        cls_id = {c: i for i, c in enumerate(classes)}
        if len(base):
            remap = np.array([cls_id.get(c, 0) for c in self._classes], dtype=np.uint16)
            base = base.copy()
            base["cls"] = remap[base["cls"]]
        rows = np.zeros(len(items), dtype=MANIFEST_DTYPE)
        if items:
            rows["key"] = np.frombuffer(b"".join(k for k, _ in items), np.uint8).reshape(-1, 16)
            rows["parent"] = np.frombuffer(
                b"".join(r[2] or _ZERO16 for _, r in items), np.uint8
            ).reshape(-1, 16)
            rows["tenant"] = np.frombuffer(
                b"".join(r[3] or _ZERO16 for _, r in items), np.uint8
            ).reshape(-1, 16)
            rows["flags"] = [(r[2] is not None) | (r[3] is not None) << 1 for _, r in items]
            rows["cls"] = [cls_id[r[4]] for _, r in items]
            rows["segment"] = [r[0] for _, r in items]
            rows["slot"] = [r[1] for _, r in items]
            rows["expires"] = [r[5] for _, r in items]
            rows["xxh3"] = [r[6] for _, r in items]
        return (np.concatenate([base, rows]) if len(base) else rows), classes
