"""Loading a whole durable tier into an empty ``PrefixIndex`` at once (reopen of 1M blocks).

``rebuild_index`` restores blocks one by one (tens of microseconds each: tens of seconds at a
million blocks). When the index is empty and the tier hands over columns
(``recovered_columns``), this module does the same work with numpy instead: parent ids,
which subtrees hang below a missing parent (orphans) or an expired block, depths (for LRU
order), sibling links, child counts, expiry buckets and the LRU list are computed as arrays
and written into the index's columns in one go. The result is the index ``restore`` +
``reorder_lru`` would have built (same nodes, parents, children, tiers, expiries, LRU order).
"""

from __future__ import annotations

import contextlib
import gc
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .index import PrefixIndex
from .index_columns import _NONE
from .index_nodes import EXPIRY_BUCKET


class RecoveredColumns:
    """Blocks a durable tier found on open, as parallel columns: ``keys`` and either the lists
    ``parents``, ``retention``, ``expires`` (the latest persisted expiry of each block) and
    ``tenants``, or their numpy forms when the tier has them at hand (a manifest):
    ``parent_array`` / ``tenant_array`` ("S16", bytes ignored where ``has_parent`` /
    ``has_tenant`` is false), ``retention_codes`` indexing ``retention_names``,
    ``expires_array``. A list asked for is built from the arrays on first use; ``bulk_load``
    reads the arrays directly. ``key_pos`` (``key -> position``), when given, becomes the
    index's own key map instead of building another one."""

    def __init__(
        self,
        keys: list[bytes],
        parents: list[bytes | None] | None = None,
        retention: list[str] | None = None,
        expires: list[float] | None = None,
        tenants: list[bytes | None] | None = None,
        *,
        key_array: np.ndarray | None = None,
        parent_array: np.ndarray | None = None,
        has_parent: np.ndarray | None = None,
        tenant_array: np.ndarray | None = None,
        has_tenant: np.ndarray | None = None,
        retention_codes: np.ndarray | None = None,
        retention_names: list[str] | None = None,
        expires_array: np.ndarray | None = None,
        key_pos: dict[bytes, int] | None = None,
    ) -> None:
        self.keys = keys
        self._parents = parents
        self._retention = retention
        self._expires = expires
        self._tenants = tenants
        self.key_array = key_array
        self.parent_array = parent_array
        self.has_parent = has_parent
        self.tenant_array = tenant_array
        self.has_tenant = has_tenant
        self.retention_codes = retention_codes
        self.retention_names = retention_names
        self.expires_array = expires_array
        self.key_pos = key_pos
        if parents is None and (parent_array is None or has_parent is None):
            raise ValueError("RecoveredColumns needs parents or parent_array and has_parent")
        if retention is None and (retention_codes is None or retention_names is None):
            raise ValueError("RecoveredColumns needs retention or retention_codes and names")
        if expires is None and expires_array is None:
            raise ValueError("RecoveredColumns needs expires or expires_array")
        if tenants is None and (tenant_array is None or has_tenant is None):
            raise ValueError("RecoveredColumns needs tenants or tenant_array and has_tenant")

    @staticmethod
    def _optional(values: np.ndarray, present: np.ndarray) -> list[bytes | None]:
        raw = np.ascontiguousarray(values).view("V16").tolist()
        out: list[bytes | None] = raw
        for i in np.flatnonzero(~present).tolist():
            out[i] = None
        return out

    @property
    def parents(self) -> list[bytes | None]:
        if self._parents is None:
            assert self.parent_array is not None and self.has_parent is not None
            self._parents = self._optional(self.parent_array, self.has_parent)
        return self._parents

    @property
    def tenants(self) -> list[bytes | None]:
        if self._tenants is None:
            assert self.tenant_array is not None and self.has_tenant is not None
            self._tenants = self._optional(self.tenant_array, self.has_tenant)
        return self._tenants

    @property
    def retention(self) -> list[str]:
        if self._retention is None:
            assert self.retention_codes is not None and self.retention_names is not None
            self._retention = list(
                map(self.retention_names.__getitem__, self.retention_codes.tolist())
            )
        return self._retention

    @property
    def expires(self) -> list[float]:
        if self._expires is None:
            assert self.expires_array is not None
            self._expires = self.expires_array.tolist()
        return self._expires


@dataclass
class BulkResult:
    orphans: list[bytes]  # below a missing parent: delete from the tier
    expired: list[bytes]  # expired, or below an expired block: delete from the tier
    unknown: dict[str, int]  # retention classes the policy does not name -> blocks kept
    tenants: dict[bytes, bytes]  # first block -> tenant tag


def _q(a: np.ndarray) -> array[int]:
    out = array("q")
    out.frombytes(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return out


def _l(a: np.ndarray) -> array[int]:
    out = array("l")
    out.frombytes(np.ascontiguousarray(a, dtype=np.dtype("l")).tobytes())
    return out


def bulk_load(index: PrefixIndex, tier: int, cols: RecoveredColumns, now: float) -> BulkResult:
    """Fill the empty ``index`` with ``cols`` as resident in ``tier``."""
    if len(index):
        raise ValueError("bulk_load needs an empty index")
    t = index._check_tier(tier)
    n = len(cols.keys)
    par = _parent_positions(cols)  # -1: a first block, -2: the parent is not there
    exp = np.asarray(
        cols.expires_array if cols.expires_array is not None else cols.expires, dtype=np.float64
    )
    idx = np.arange(n, dtype=np.int64)
    # Pointer jumping: ``up`` doubles its reach each round while ``dead`` ORs and ``depth``
    # sums along the path, so after log2(depth) rounds every block knows the top of its
    # chain, whether anything on the way up expired, and how deep it is.
    up = np.where(par >= 0, par, idx)
    dead = exp <= now
    depth = (par >= 0).astype(np.int64)
    for _ in range(64):
        nxt = up[up]
        dead = dead | dead[up]
        depth = depth + depth[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    # A chain is anchored when its top block is a true first block (parent None); a top block
    # whose parent is missing, or a cycle (no top at all), makes the whole chain orphaned.
    orphan = par[up] != -1
    dead &= ~orphan
    keep = ~(orphan | dead)

    keys = cols.keys
    orphans = [keys[i] for i in np.flatnonzero(orphan).tolist()]
    expired = [keys[i] for i in np.flatnonzero(dead).tolist()]
    kept = np.flatnonzero(keep)
    m = len(kept)
    # New ids 0..m-1 in kept order; parents map through.
    new_id = np.full(n, _NONE, dtype=np.int64)
    new_id[kept] = np.arange(m, dtype=np.int64)
    kpar = par[kept]
    parent = np.where(kpar >= 0, new_id[np.maximum(kpar, 0)], _NONE)
    kexp = exp[kept]

    # Sibling lists: children of one parent linked in id order.
    first_child = np.full(m, _NONE, dtype=np.int64)
    next_sib = np.full(m, _NONE, dtype=np.int64)
    prev_sib = np.full(m, _NONE, dtype=np.int64)
    has_p = np.flatnonzero(parent >= 0)
    if len(has_p):
        order = has_p[np.argsort(parent[has_p], kind="stable")]
        ps = parent[order]
        same = ps[1:] == ps[:-1]
        next_sib[order[:-1][same]] = order[1:][same]
        prev_sib[order[1:][same]] = order[:-1][same]
        starts = np.concatenate(([True], ~same))
        first_child[ps[starts]] = order[starts]
    nchildren = np.bincount(parent[has_p], minlength=m) if m else np.zeros(0, np.int64)

    # Retention classes.
    ret, unknown = _retention_ids(index, cols, kept, m == n)

    # LRU: older expiry first, deeper first on ties (leaves before their ancestors).
    lru = np.lexsort((-depth[kept], kexp)) if m else np.zeros(0, np.int64)
    lru_prev = np.full(m, _NONE, dtype=np.int64)
    lru_next = np.full(m, _NONE, dtype=np.int64)
    if m:
        lru_prev[lru[1:]] = lru[:-1]
        lru_next[lru[:-1]] = lru[1:]

    kkeys = keys if m == n else [keys[i] for i in kept.tolist()]
    if m == n and cols.key_pos is not None and len(cols.key_pos) == n:
        index._ids = cols.key_pos  # handed over: the same key -> position map
    else:
        index._ids = dict(zip(kkeys, range(m)))
    if m == n and cols.key_array is not None:
        index._keys = bytearray(np.ascontiguousarray(cols.key_array).tobytes())
    else:
        index._keys = bytearray(b"".join(kkeys))
    index._alive = bytearray(b"\x01" * m)
    index._parent = _q(parent)
    index._first_child = _q(first_child)
    index._next_sib = _q(next_sib)
    index._prev_sib = _q(prev_sib)
    index._nchildren = _l(nchildren)
    index._child_in = [
        _l(nchildren) if j == t else _l(np.zeros(m, np.int64)) for j in range(index.num_tiers)
    ]
    index._tiers = bytearray(bytes([1 << t]) * m)
    index._pins = _l(np.zeros(m, np.int64))
    index._expires = array("d", kexp.tobytes()) if m else array("d")
    index._stamp = array("d", kexp.tobytes()) if m else array("d")
    index._ret = array("H", ret.astype(np.uint16).tobytes()) if m else array("H")
    buckets = np.floor(kexp / EXPIRY_BUCKET).astype(np.int64)
    index._bucket_of = _q(buckets)
    index._buckets = {}
    if m:
        border = np.argsort(buckets, kind="stable")
        bs = buckets[border]
        cuts = np.flatnonzero(bs[1:] != bs[:-1]) + 1
        for chunk in np.split(border, cuts):
            index._buckets[int(buckets[chunk[0]])] = _q(chunk)
    for j in range(index.num_tiers):
        if j == t:
            index._lru_prev[j] = _q(lru_prev)
            index._lru_next[j] = _q(lru_next)
        else:
            index._lru_prev[j] = _q(np.full(m, _NONE, np.int64))
            index._lru_next[j] = _q(np.full(m, _NONE, np.int64))
    index._head[t] = int(lru[0]) if m else _NONE
    index._tail[t] = int(lru[-1]) if m else _NONE
    index._count[t] = m

    firsts = np.flatnonzero(keep & (par == -1)).tolist()
    if cols.tenant_array is not None and cols.has_tenant is not None:
        tarr, has_t = cols.tenant_array, cols.has_tenant
        tenants = {keys[i]: tarr[i : i + 1].tobytes() for i in firsts if has_t[i]}
    else:
        tenants = {keys[i]: ten for i in firsts if (ten := cols.tenants[i]) is not None}
    return BulkResult(orphans, expired, unknown, tenants)


def _retention_ids(
    index: PrefixIndex, cols: RecoveredColumns, kept: np.ndarray, all_kept: bool
) -> tuple[np.ndarray, dict[str, int]]:
    """Each kept block's retention class id in ``index``, and the classes its policy does not
    name with their block counts."""
    known = index.retention.ttls
    unknown: dict[str, int] = {}
    if cols.retention_codes is not None and cols.retention_names is not None:
        codes = cols.retention_codes if all_kept else cols.retention_codes[kept]
        names = cols.retention_names
        counts = np.bincount(codes.astype(np.int64), minlength=len(names))
        lut = np.zeros(max(1, len(names)), dtype=np.uint16)
        for c, name in enumerate(names):
            if not counts[c]:
                continue
            lut[c] = index._class(name)
            if name not in known:
                unknown[name] = int(counts[c])
        return lut[codes], unknown
    kret = cols.retention if all_kept else [cols.retention[i] for i in kept.tolist()]
    for r in set(kret):
        index._class(r)
        if r not in known:
            unknown[r] = 0
    if unknown:
        for r in kret:
            if r in unknown:
                unknown[r] += 1
    ret = np.fromiter(map(index._class_id.__getitem__, kret), dtype=np.uint16, count=len(kret))
    return ret, unknown


def _parent_positions(cols: RecoveredColumns) -> np.ndarray:
    """Each block's parent as a position in ``cols`` (sorted keys + binary search)."""
    n = len(cols.keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = cols.key_array
    if keys is None:
        keys = np.frombuffer(b"".join(cols.keys), dtype="S16")
    parents, has = cols.parent_array, cols.has_parent
    if parents is None or has is None:
        zero = bytes(16)
        parents = np.frombuffer(b"".join(p or zero for p in cols.parents), dtype="S16")
        has = np.fromiter((p is not None for p in cols.parents), dtype=bool, count=n)
    # Sort and search on the first 8 bytes of each hash as an integer (hashes are uniformly
    # random, so these are distinct in practice); full 16-byte equality confirms each match.
    # With two keys sharing their first 8 bytes, fall back to a dict.
    hi = np.frombuffer(keys.tobytes(), dtype="<u8")[0::2]
    phi = np.frombuffer(parents.tobytes(), dtype="<u8")[0::2]
    order = np.argsort(hi, kind="stable")
    sk = hi[order]
    if n > 1 and bool(np.any(sk[1:] == sk[:-1])):
        pos = dict(zip(cols.keys, range(n)))
        if len(pos) != n:
            raise ValueError("duplicate keys in recovered columns")
        found_at = np.fromiter(
            (pos.get(p, -2) if p is not None else -1 for p in cols.parents), np.int64, n
        )
        return found_at
    out = np.where(has, -2, -1).astype(np.int64)
    # A chain is usually stored parent first, so most parents are the row just before: those
    # are settled by one comparison, and only the rest are searched (random probes into a
    # million sorted keys are what the search costs).
    prev = np.zeros(n, dtype=bool)
    prev[1:] = has[1:] & (parents[1:] == keys[:-1])
    out[1:][prev[1:]] = np.arange(n - 1, dtype=np.int64)[prev[1:]]
    rest = np.flatnonzero(has & ~prev)
    if len(rest):
        j = np.minimum(np.searchsorted(sk, phi[rest]), n - 1)
        cand = order[j]
        found = (sk[j] == phi[rest]) & (keys[cand] == parents[rest])
        out[rest[found]] = cand[found]
    return out


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collections while a million small objects are created at once (each
    generation-0 pass would otherwise walk the growing young set: seconds at 1M blocks)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
