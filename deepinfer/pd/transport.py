"""KV page transfer between worker processes through POSIX shared memory.

The sender gathers a sequence's pages out of its pool (``deepinfer_kernels.gather_blocks``
along the pool's block dimension) into a fresh shared-memory segment and describes it in a JSON
handle ``{"shm", "shape", "dtype"}``; the receiver maps the segment, scatters the pages into its
own blocks (``scatter_blocks``) and unlinks the segment. Only raw bytes and JSON cross processes.

Segments are named ``dikv_<pid>_<random>`` after the exporting process, so an operator (or a
leak check) can tell ours from other programs' and see which worker made one.
"""

from __future__ import annotations

import os
import secrets
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import torch

from deepinfer.models.kv_pool import KVPool
from deepinfer_kernels import gather_blocks, scatter_blocks

BLOCK_DIM = 2  # the block dimension of `KVPool.tensor` [L, 2, blocks, block_size, Hkv, D]
SEGMENT_PREFIX = "dikv_"


def segment_prefix(pid: int | None = None) -> str:
    """The name prefix of the segments process ``pid`` (default: this one) exports; short
    enough for macOS's 31-character limit on shared-memory names."""
    return f"{SEGMENT_PREFIX}{os.getpid() if pid is None else int(pid)}_"


def _create_segment(nbytes: int) -> shared_memory.SharedMemory:
    for _ in range(8):
        try:
            return shared_memory.SharedMemory(
                name=segment_prefix() + secrets.token_hex(4), create=True, size=max(nbytes, 1)
            )
        except FileExistsError:  # a random suffix collided with a live segment: draw again
            continue
    raise FileExistsError("could not find a free shared-memory segment name")


def export_pages(pool: KVPool, block_ids: list[int]) -> dict[str, Any]:
    """Copy ``pool`` pages ``block_ids`` into a new shared-memory segment; return its handle.

    The segment outlives this call and this process: whoever consumes the handle (or gives up
    on it) must call :func:`import_pages` or :func:`discard`.
    """
    ids = torch.tensor(block_ids, dtype=torch.int64, device=pool.tensor.device)
    pages = gather_blocks(pool.tensor, ids, block_dim=BLOCK_DIM).contiguous().cpu()
    nbytes = pages.numel() * pages.element_size()
    shm = _create_segment(nbytes)
    try:
        dst = torch.frombuffer(shm.buf, dtype=pages.dtype, count=pages.numel())
        dst.copy_(pages.reshape(-1))
        del dst
    finally:
        shm.close()
    # Ownership passes to the receiver, which unlinks it; this process must not clean it up.
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return {"shm": shm.name, "shape": list(pages.shape), "dtype": str(pages.dtype)}


def import_pages(pool: KVPool, handle: dict[str, Any], block_ids: list[int]) -> None:
    """Scatter the pages described by ``handle`` into ``pool`` blocks ``block_ids`` and unlink
    the segment (also when the copy fails)."""
    shm = shared_memory.SharedMemory(name=str(handle["shm"]))
    try:
        dtype = pool.tensor.dtype  # the handle names it as str(dtype) does: compare those
        shape = [int(s) for s in handle["shape"]]
        if str(handle["dtype"]) != str(dtype):
            raise ValueError(
                f"KV dtype {handle['dtype']} does not match the pool's {pool.tensor.dtype}"
            )
        expect = list(pool.tensor.shape)
        expect[BLOCK_DIM] = len(block_ids)
        if shape != expect:
            raise ValueError(f"KV pages shaped {shape}, expected {expect}")
        count = 1
        for s in shape:
            count *= s
        src = torch.frombuffer(shm.buf, dtype=dtype, count=count).view(shape)
        ids = torch.tensor(block_ids, dtype=torch.int64, device=pool.tensor.device)
        scatter_blocks(pool.tensor, ids, src.to(pool.tensor.device), block_dim=BLOCK_DIM)
        del src
    finally:
        shm.close()
        shm.unlink()


def discard(handle: dict[str, Any]) -> bool:
    """Unlink a segment nobody will import; False if it was already gone (or ``handle`` is
    not a shared-memory one: a Ray object ref is freed when its last holder drops it)."""
    if "shm" not in handle:
        return False
    try:
        shm = shared_memory.SharedMemory(name=str(handle["shm"]))
    except FileNotFoundError:
        return False
    shm.close()
    shm.unlink()
    return True


def segment_exists(name: str) -> bool:
    """Whether a shared-memory segment of that name is still linked (for leak checks)."""
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return False
    shm.close()
    # Attaching registered it with this process's tracker in Python < 3.13; undo that.
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return True
