"""The two on-disk formats: each tier refuses the other's directory (never silently ignores or
deletes it), and the "files" format converts to "segments" in place, crash-safely
(``SegmentDiskTier(migrate=True)`` and ``deepinfer-cache migrate``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from _cache_helpers import BS, PAGE, pages_for

from deepinfer_cache import DiskTier, HostTier, SegmentDiskTier, TieredKVStore
from deepinfer_cache.cli import main
from deepinfer_cache.tiers import CacheFormatError
from deepinfer_cache.tiers import disk_formats as fmt_mod
from deepinfer_cache.tiers.disk_formats import holds_files_format

CHAINS = [(list(range(s, s + 5 * BS)), f"t{s % 3}".encode()) for s in range(0, 800, 100)]


def files_cache(path: Path) -> None:
    """A "files" cache of 8 chains of 5 blocks (40 files), tenants, an agent class, a touch."""
    host = HostTier(PAGE, torch.float32, 1 << 20)  # flush() writes what a full queue dropped
    store = TieredKVStore([host, DiskTier(path, PAGE, torch.float32, 1 << 24)], BS)
    for i, (tokens, ns) in enumerate(CHAINS):
        retention = "agent" if i % 2 else "chat"
        store.store(tokens, pages_for(tokens, ns), retention=retention, namespace=ns)
    assert store.flush()
    store.close()
    assert len(block_files(path)) == 40


def block_files(path: Path) -> list[Path]:
    return sorted(p for p in (path / "blocks").glob("*/*"))


def segment_store(path: Path, **kw) -> TieredKVStore:
    return segment_store_of(path, 1 << 24, **kw)


def segment_store_of(path: Path, capacity: int, **kw) -> TieredKVStore:
    return TieredKVStore([SegmentDiskTier(path, PAGE, torch.float32, capacity, **kw)], BS)


def all_served(store: TieredKVStore, chains=CHAINS) -> bool:
    for tokens, ns in chains:
        got = store.fetch(tokens, namespace=ns).result()
        if got.num_blocks != 5 or not torch.equal(got.stacked(), pages_for(tokens, ns)):
            return False
    return True


def test_each_tier_refuses_the_other_format_and_changes_nothing(tmp_path) -> None:
    files_cache(tmp_path)
    before = {p: p.read_bytes() for p in block_files(tmp_path)}
    assert len(before) == 40
    with pytest.raises(CacheFormatError) as err:
        SegmentDiskTier(tmp_path, PAGE, torch.float32, 1 << 24)
    msg = str(err.value)
    assert "'files' format" in msg and f"deepinfer-cache migrate {tmp_path}" in msg
    assert "disk_format='files'" in msg
    assert {p: p.read_bytes() for p in block_files(tmp_path)} == before
    assert not (tmp_path / "manifest").exists()
    store = TieredKVStore([DiskTier(tmp_path, PAGE, torch.float32, 1 << 24)], BS)  # unlocked
    assert all_served(store)
    store.close()

    seg = tmp_path / "seg"
    store = segment_store(seg)
    tokens, ns = CHAINS[0]
    store.store(tokens, pages_for(tokens, ns), namespace=ns)
    store.close()
    with pytest.raises(CacheFormatError, match="'segments' format"):
        DiskTier(seg, PAGE, torch.float32, 1 << 24)
    store = segment_store(seg)  # the refusal kept nothing locked and nothing changed
    assert all_served(store, CHAINS[:1])
    store.close()


def test_migrate_on_open_keeps_every_block_tenant_class_and_expiry(tmp_path) -> None:
    files_cache(tmp_path)
    first = DiskTier(tmp_path, PAGE, torch.float32, 1 << 24)
    rec = {b.key: b for b in first.recovered()}
    first.close()
    tier = SegmentDiskTier(tmp_path, PAGE, torch.float32, 1 << 24, migrate=True)
    m = tier.migration
    assert m is not None
    assert (m.blocks_copied, m.files_removed, m.corrupt_quarantined) == (40, 40, 0)
    assert not (tmp_path / "blocks").exists() and not holds_files_format(str(tmp_path))
    metas = {b.key: b.meta for b in tier.recovered()}
    assert {k: (b.meta.parent, b.meta.retention, b.meta.tenant) for k, b in rec.items()} == {
        k: (v.parent, v.retention, v.tenant) for k, v in metas.items()
    }
    assert all(metas[k].expires_at >= max(b.meta.expires_at, b.mtime) for k, b in rec.items())
    # Chains were copied parents first: a block sits in the slot after its parent's.
    after_parent = 0
    for k, b in rec.items():
        if b.meta.parent is not None:
            (seg, off), (pseg, poff) = tier.location_of(k), tier.location_of(b.meta.parent)
            after_parent += seg == pseg and off == poff + tier.record_bytes
    assert after_parent >= 32 - 8  # all but where a chain crosses into the next segment
    tier.close()
    store = segment_store(tmp_path)  # a plain open now: nothing refused, nothing lost
    assert store.tiers[0].counters.tail_records_scanned == 0  # all in the manifest
    assert all_served(store)
    assert store.delete_namespace(b"t1") == 15  # tenants survived the move
    assert all_served(store, [c for c in CHAINS if c[1] != b"t1"])
    store.close()


def test_a_damaged_block_file_is_quarantined_not_copied_not_deleted(tmp_path) -> None:
    files_cache(tmp_path)
    victim = block_files(tmp_path)[7]
    with open(victim, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        byte = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x5A]))
    store = segment_store(tmp_path, migrate=True)
    m = store.tiers[0].migration
    assert m is not None and m.corrupt_quarantined == 1 and m.blocks_copied == 39
    kept = [p.name for p in (tmp_path / "quarantine").iterdir()]
    assert any(name.startswith(victim.name) for name in kept)
    served = sum(store.fetch(t, namespace=n).result().num_blocks for t, n in CHAINS)
    assert 35 <= served < 40  # the damaged block (and blocks below it) miss; none is wrong
    for t, n in CHAINS:
        got = store.fetch(t, namespace=n).result()
        assert all(torch.equal(a, b) for a, b in zip(got.pages, pages_for(t, n)))
    store.close()


class Killed(BaseException):
    """A crash at this point (not an error anything may catch)."""


@pytest.mark.parametrize("at", ["copy", "remove"])
def test_a_crash_during_migration_loses_nothing_and_a_rerun_finishes(
    tmp_path, monkeypatch, at: str
) -> None:
    files_cache(tmp_path)
    calls = 0

    def crash_after(n: int, real):
        def wrapper(*args):
            nonlocal calls
            calls += 1
            if calls > n:
                raise Killed
            return real(*args)

        return wrapper

    if at == "copy":  # killed while copying: old files all there, some segments written
        monkeypatch.setattr(fmt_mod, "read_block_file", crash_after(17, fmt_mod.read_block_file))
    else:  # killed while removing old files: the manifest listing all 40 is durable
        monkeypatch.setattr(fmt_mod, "_remove_file", crash_after(13, fmt_mod._remove_file))
    with pytest.raises(Killed):
        segment_store(tmp_path, migrate=True)
    monkeypatch.undo()
    left = len(block_files(tmp_path))
    assert left == (40 if at == "copy" else 27)
    with pytest.raises(CacheFormatError):  # a half-migrated directory is still refused
        SegmentDiskTier(tmp_path, PAGE, torch.float32, 1 << 24)
    store = segment_store(tmp_path, migrate=True)
    m = store.tiers[0].migration
    assert m is not None and m.files_removed == left
    assert m.already_in_segments == (17 if at == "copy" else 27)
    assert m.blocks_copied + m.already_in_segments == left
    assert all_served(store) and not block_files(tmp_path)
    store.close()


def test_migration_past_capacity_keeps_every_block_and_the_store_evicts_down_to_it(
    tmp_path,
) -> None:
    files_cache(tmp_path)
    store = segment_store_of(tmp_path, capacity=30 * 4096, migrate=True)
    tier = store.tiers[0]
    assert len(tier) == 40 and tier.used_bytes() > tier.capacity_bytes
    assert all_served(store)  # nothing was dropped on the way
    tokens = list(range(5000, 5000 + 5 * BS))
    store.store(tokens, pages_for(tokens))  # the next write evicts down to the capacity
    assert store.lookup(tokens).num_blocks == 5
    assert tier.used_bytes() <= tier.capacity_bytes and len(tier) <= 30
    store.close()


def test_cli_migrate(tmp_path, capsys) -> None:
    files_cache(tmp_path)
    held = DiskTier(tmp_path, PAGE, torch.float32, 1 << 24)  # an engine still running
    assert main(["migrate", str(tmp_path)]) == 1
    assert "locked" in capsys.readouterr().err.lower()
    held.close()
    assert main(["migrate", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["blocks_copied"] == 40 and out["files_removed"] == 40
    assert main(["migrate", str(tmp_path)]) == 0
    assert "nothing to migrate" in capsys.readouterr().out
    assert main(["migrate", str(tmp_path / "nope")]) == 2
    assert "directory" in capsys.readouterr().err
    store = segment_store(tmp_path)
    assert all_served(store)
    store.close()
