"""The ``Tier`` protocol and the page-movement seam shared by the tiers.

A *page* is one block's KV: ``pool.select(block_dim, i)`` of the engine's pool, e.g.
``[num_layers, 2, block_size, num_kv_heads, head_dim]``. Batches of pages travel stacked on a
new leading dimension: ``[n, *page_shape]``.

Tiers move pages with ``gather_fn(pool, block_ids, *, block_dim) -> Tensor`` (the selected
blocks, still on ``block_dim``) and ``scatter_fn(pool, block_ids, src, *, block_dim)``. The
defaults are plain torch indexing; an integration layer may pass faster kernels with the same
signature (``deepinfer_kernels.gather_blocks`` / ``scatter_blocks``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from ..meta import BlockMeta

__all__ = [
    "BlockMeta",
    "GatherFn",
    "ScatterFn",
    "Tier",
    "check_key",
    "check_page",
    "check_page_shape",
    "page_nbytes",
    "torch_gather",
    "torch_scatter",
]


class GatherFn(Protocol):
    def __call__(
        self, pool: torch.Tensor, block_ids: torch.Tensor, /, *, block_dim: int = 0
    ) -> torch.Tensor: ...


class ScatterFn(Protocol):
    def __call__(
        self,
        pool: torch.Tensor,
        block_ids: torch.Tensor,
        src: torch.Tensor,
        /,
        *,
        block_dim: int = 0,
    ) -> None: ...


def torch_gather(
    pool: torch.Tensor, block_ids: torch.Tensor, *, block_dim: int = 0
) -> torch.Tensor:
    """``pool.index_select(block_dim, block_ids)``: a new tensor holding the chosen blocks."""
    return pool.index_select(block_dim, block_ids.to(device=pool.device, dtype=torch.long))


def torch_scatter(
    pool: torch.Tensor, block_ids: torch.Tensor, src: torch.Tensor, *, block_dim: int = 0
) -> None:
    """``pool.index_copy_(block_dim, block_ids, src)``: write ``src``'s blocks in place."""
    pool.index_copy_(
        block_dim,
        block_ids.to(device=pool.device, dtype=torch.long),
        src.to(device=pool.device, dtype=pool.dtype),
    )


def page_nbytes(page_shape: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(page_shape) * torch.empty((), dtype=dtype).element_size()


@runtime_checkable
class Tier(Protocol):
    """One storage level. Tiers hold copies of pages keyed by block hash; the store decides
    placement and eviction, a tier only stores, returns and frees. ``put`` may refuse (no free
    slot, I/O failure) by returning False; ``get`` returns None for a missing or corrupt page."""

    name: str
    page_shape: tuple[int, ...]
    dtype: torch.dtype
    page_bytes: int
    capacity_bytes: int

    def __contains__(self, key: object) -> bool: ...

    def __len__(self) -> int: ...

    def used_bytes(self) -> int: ...

    def has_room(self) -> bool: ...

    def put(self, key: bytes, page: torch.Tensor, meta: BlockMeta) -> bool: ...

    def get(self, key: bytes) -> torch.Tensor | None: ...

    def delete(self, key: bytes) -> None: ...

    def keys(self) -> list[bytes]: ...

    def close(self) -> None: ...


def check_page(page: torch.Tensor, page_shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if not isinstance(page, torch.Tensor):
        raise TypeError(f"page must be a torch.Tensor, got {type(page).__name__}")
    if tuple(page.shape) != page_shape:
        raise ValueError(f"page must have shape {page_shape}, got {tuple(page.shape)}")
    if page.dtype != dtype:
        raise TypeError(f"page must have dtype {dtype}, got {page.dtype}")


def check_page_shape(page_shape: Sequence[int]) -> tuple[int, ...]:
    """``page_shape`` as a tuple of positive ints (a zero dimension would make empty pages)."""
    try:
        shape = tuple(page_shape)
    except TypeError:
        raise TypeError(f"page_shape must be a sequence of ints, got {page_shape!r}") from None
    try:
        if any(isinstance(s, bool) for s in shape):
            raise TypeError
        dims = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"page_shape must be a sequence of ints, got {shape!r}") from None
    if any(d <= 0 for d in dims):
        raise ValueError(f"page_shape dimensions must be positive, got {dims!r}")
    return dims


def check_key(key: object) -> bytes:
    if not isinstance(key, bytes) or len(key) != 16:
        raise TypeError("key must be a 16-byte block hash")
    return key
