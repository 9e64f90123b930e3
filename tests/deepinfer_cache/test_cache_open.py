"""Opening a cache directory (#20 item 4): a failed open releases the lock, odd directory
entries are quarantined instead of failing the open, and the lock is not inherited by forked
children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from _cache_helpers import BS, PAGE, page_for, pages_for

from deepinfer_cache import DiskTier, TieredKVStore, hash_token_blocks


def open_disk(path) -> DiskTier:
    return DiskTier(path, PAGE, torch.float32, 1 << 20, fsync=False)


def test_failed_tier_open_releases_the_lock(tmp_path, monkeypatch) -> None:
    def broken_scan(self) -> None:
        raise OSError(5, "injected scan failure")

    monkeypatch.setattr(DiskTier, "_scan", broken_scan)
    with pytest.raises(OSError, match="injected"):
        open_disk(tmp_path)
    monkeypatch.undo()
    open_disk(tmp_path).close()  # a retry in the same process is not locked out


def test_failed_store_open_closes_its_tiers(tmp_path) -> None:
    with pytest.raises(ValueError, match="block_size"):
        TieredKVStore([open_disk(tmp_path)], block_size=0)
    with TieredKVStore([open_disk(tmp_path)], BS) as store:
        assert store.lookup(list(range(BS))).num_blocks == 0


def test_odd_directory_entries_are_quarantined_not_fatal(tmp_path) -> None:
    tokens = list(range(3 * BS))
    with TieredKVStore([open_disk(tmp_path)], BS) as store:
        store.store(tokens, pages_for(tokens))
    # Damage of the kinds an operator (or a broken tool) leaves behind.
    shard = tmp_path / "blocks" / "7f"
    os.symlink(shard / "loop", shard / "loop")  # a self-referencing symlink
    os.mkfifo(shard / ("ab" * 16))  # a FIFO named like a block: opening it would hang
    (shard / "subdir").mkdir()
    os.rmdir(tmp_path / "blocks" / "00")
    (tmp_path / "blocks" / "00").write_bytes(b"not a directory")
    for name in ("tmp", "quarantine"):
        os.rename(tmp_path / name, tmp_path / f"{name}.old")
        (tmp_path / name).write_bytes(b"junk")
    (tmp_path / "blocks" / "README").write_text("stray file")

    disk = open_disk(tmp_path)
    with TieredKVStore([disk], BS) as store:
        assert store.lookup(tokens).num_blocks == 3
        for h, page in zip(hash_token_blocks(tokens, BS), store.fetch(tokens).result().pages):
            assert torch.equal(page, page_for(h))
        assert disk.counters.odd_entries_quarantined >= 6
    assert (tmp_path / "tmp").is_dir() and (tmp_path / "quarantine").is_dir()
    assert (tmp_path / "blocks" / "00").is_dir()
    assert not any(p.is_symlink() for p in shard.iterdir())


CHILD = r"""
import os, sys, time
sys.path.insert(0, sys.argv[2])
import torch
from _cache_helpers import PAGE
from deepinfer_cache import DiskTier
tier = DiskTier(sys.argv[1], PAGE, torch.float32, 1 << 20)
pid = os.fork()
if pid == 0:  # a forked worker that never execs and outlives its parent
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # let the test's pipe close when the parent exits
    os.dup2(null, 2)
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
os._exit(0)  # the parent dies without closing anything
"""


def test_lock_is_not_inherited_by_forked_children(tmp_path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    helpers = os.path.dirname(__file__)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "kv"), helpers],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    child = int(out.stdout.strip())
    try:
        os.kill(child, 0)  # the forked child is still alive...
        open_disk(tmp_path / "kv").close()  # ...yet the lock died with its parent
    finally:
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)
