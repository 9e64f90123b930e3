"""KV pages between a prefill actor and a decode actor through Ray's object store.

The prefill side gathers a request's pages out of its pool into one contiguous CPU buffer and
``ray.put``s it as a flat byte array (dtype and shape travel in the JSON handle, so bfloat16
needs no NumPy dtype). The replica loop only speaks JSON, so the handle names the object by a
key; the actor swaps the key for the `ObjectRef` when it hands the ``prefilled`` message to the
front (`take`), and the decode actor files the ref it receives under the same key (`receive`)
before the JSON message reaches its replica. On the decode side ``ray.get`` maps the buffer
read-only out of the node's object store (shared memory: no copy when both actors sit on one
node; Ray pulls it once across nodes otherwise) and the pages are scattered straight from it
into the pool's blocks.

The object lives as long as someone holds its ref (Ray's reference counting): the front while
the request is in transit, the decode actor until it imported or discarded the pages.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import numpy as np
import ray
import torch

from deepinfer.models.kv_pool import KVPool
from deepinfer.pd.transport import BLOCK_DIM
from deepinfer_kernels import gather_blocks, scatter_blocks

GET_TIMEOUT_S = 120.0  # a decode actor gives up on pages that never arrive


class ObjectStoreTransport:
    """`KVTransport` of a replica actor (one per actor; thread-safe)."""

    def __init__(self) -> None:
        self._refs: dict[str, Any] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ actor side
    def take(self, key: str) -> Any:
        """The ref exported under ``key`` (the actor passes it on to the front)."""
        with self._lock:
            return self._refs.pop(key, None)

    def receive(self, key: str, ref: Any) -> None:
        """File a ref the front sent along with a ``decode`` message."""
        with self._lock:
            self._refs[key] = ref

    def held(self) -> int:
        with self._lock:
            return len(self._refs)

    # ------------------------------------------------------------------ KVTransport
    def export_pages(self, pool: KVPool, block_ids: list[int]) -> dict[str, Any]:
        ids = torch.tensor(block_ids, dtype=torch.int64, device=pool.tensor.device)
        pages = gather_blocks(pool.tensor, ids, block_dim=BLOCK_DIM).contiguous().cpu()
        raw = pages.reshape(-1).view(torch.uint8).numpy()
        key = uuid.uuid4().hex
        ref = ray.put(raw)
        with self._lock:
            self._refs[key] = ref
        return {
            "ray": key,
            "shape": list(pages.shape),
            "dtype": str(pages.dtype),
            "nbytes": int(raw.nbytes),
        }

    def import_pages(self, pool: KVPool, handle: dict[str, Any], block_ids: list[int]) -> None:
        key = str(handle.get("ray", ""))
        ref = self.take(key)
        if ref is None:
            raise ValueError(f"KV pages {key!r} were never received by this actor")
        dtype = pool.tensor.dtype  # the handle names it as str(dtype) does: compare those
        shape = [int(s) for s in handle.get("shape", ())]
        if str(handle.get("dtype")) != str(dtype):
            raise ValueError(
                f"KV dtype {handle.get('dtype')} does not match the pool's {pool.tensor.dtype}"
            )
        expect = list(pool.tensor.shape)
        expect[BLOCK_DIM] = len(block_ids)
        if shape != expect:
            raise ValueError(f"KV pages shaped {shape}, expected {expect}")
        try:
            raw = ray.get(ref, timeout=GET_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            # The prefill actor that owned the pages died, or they never arrived: the request
            # fails cleanly instead of decoding from garbage.
            raise ValueError(f"KV pages could not be fetched: {type(exc).__name__}") from exc
        if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8:
            raise ValueError("KV pages object is not a byte buffer")
        if raw.nbytes != int(np.prod(shape)) * dtype.itemsize:
            raise ValueError(f"KV pages hold {raw.nbytes} bytes, shape {shape} needs more or less")
        # A read-only view onto the object store: scatter only reads from it.
        src = torch.from_numpy(raw).view(dtype).view(shape)
        ids = torch.tensor(block_ids, dtype=torch.int64, device=pool.tensor.device)
        scatter_blocks(pool.tensor, ids, src.to(pool.tensor.device), block_dim=BLOCK_DIM)
        del src, raw

    def discard(self, handle: dict[str, Any]) -> bool:
        return self.take(str(handle.get("ray", ""))) is not None
