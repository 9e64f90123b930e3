"""Which block-key schemes have written a cache directory: ``<directory>/key_schemes.json``.

Keys of two schemes never coincide (the scheme's name is hashed into the root and the hash
functions differ), so blocks written under another scheme are misses, never wrong hits. This
record makes that visible instead of silent: a store opening a directory that holds blocks of
another scheme warns and names the ``key_hash`` that would find them. A directory from before
the record existed was keyed with BLAKE2b (key scheme v1).
"""

from __future__ import annotations

import contextlib
import json
import os

from .hashing import KEY_HASHES

RECORD = "key_schemes.json"
_LEGACY = "blake2b"  # the only scheme of releases before the record


def record_key_scheme(directory: str, key_hash: str, has_blocks: bool) -> list[str]:
    """Add ``key_hash`` to ``directory``'s record (written atomically); return the other
    schemes that wrote blocks there when the directory was last opened under another scheme
    (so the default cache directory warns once after a scheme change, not on every start).
    ``has_blocks``: the directory held blocks on open (with no record, they are the legacy
    scheme's). A damaged record is rewritten; failing to write it loses nothing but the
    warning next time."""
    path = os.path.join(directory, RECORD)
    last: str | None = None
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
        found = data.get("key_hashes", []) if isinstance(data, dict) else []
        known = [k for k in found if k in KEY_HASHES] if isinstance(found, list) else []
        last = data.get("last") if isinstance(data, dict) else None
        if last not in known:  # a record from before "last" existed: each scheme warned once
            last = key_hash if key_hash in known else None
    except FileNotFoundError:
        known = [_LEGACY] if has_blocks else []
        last = _LEGACY if has_blocks else None
    except (OSError, ValueError):
        known = []
    others = [k for k in known if k != key_hash] if has_blocks and last != key_hash else []
    if key_hash not in known or last != key_hash:
        with contextlib.suppress(OSError):
            _write_atomically(path, {"key_hashes": sorted({*known, key_hash}), "last": key_hash})
    return others


def _write_atomically(path: str, data: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(json.dumps(data).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
