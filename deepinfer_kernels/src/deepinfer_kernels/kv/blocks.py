"""``gather_blocks`` / ``scatter_blocks``: whole-page moves used by the cache tiers (public ops)."""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_kernels._dispatch import eager_or_op, should_use_triton
from deepinfer_kernels._interop import result_converter, to_torch
from deepinfer_kernels.kv.validate import check_block_ids, normalize_dim
from deepinfer_kernels.verify.validate import want_value_checks


def _gather_blocks_impl(
    cache: torch.Tensor, block_ids: torch.Tensor, block_dim: int, use_triton: bool
) -> torch.Tensor:
    if use_triton and cache.is_contiguous():
        from deepinfer_kernels.kv.triton_kv import gather_blocks_triton

        return gather_blocks_triton(cache, block_ids, block_dim)
    return torch.index_select(cache, block_dim, block_ids.to(torch.int64)).contiguous()


_gather_blocks_op = torch.library.custom_op(
    "deepinfer::gather_blocks", _gather_blocks_impl, mutates_args=()
)


@_gather_blocks_op.register_fake
def _(
    cache: torch.Tensor, block_ids: torch.Tensor, block_dim: int, use_triton: bool
) -> torch.Tensor:
    shape = list(cache.shape)
    shape[block_dim] = block_ids.shape[0]
    return cache.new_empty(shape)


def _scatter_blocks_impl(
    cache: torch.Tensor,
    block_ids: torch.Tensor,
    src: torch.Tensor,
    block_dim: int,
    use_triton: bool,
) -> None:
    if use_triton and cache.is_contiguous():
        from deepinfer_kernels.kv.triton_kv import scatter_blocks_triton

        scatter_blocks_triton(cache, block_ids, src.contiguous(), block_dim)
        return
    cache.index_copy_(block_dim, block_ids.to(torch.int64), src)


_scatter_blocks_op = torch.library.custom_op(
    "deepinfer::scatter_blocks", _scatter_blocks_impl, mutates_args=("cache",)
)


@_scatter_blocks_op.register_fake
def _(
    cache: torch.Tensor,
    block_ids: torch.Tensor,
    src: torch.Tensor,
    block_dim: int,
    use_triton: bool,
) -> None:
    return None


def gather_blocks(
    cache: Any,
    block_ids: Any,
    *,
    block_dim: int = 0,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> Any:
    """Copy the pages ``block_ids`` out of ``cache`` into a new contiguous tensor.

    ``out.select(block_dim, i) == cache.select(block_dim, block_ids[i])``: the output has the
    cache's shape with dimension ``block_dim`` resized to ``len(block_ids)`` (index-select
    semantics). ``cache`` is ``[num_blocks, ...]`` by default; ``block_dim`` lets a pool shaped
    e.g. ``[layers, 2, num_blocks, block_size, heads, dim]`` be gathered with ``block_dim=2``.
    Ids outside ``[0, num_blocks)`` raise ``ValueError`` (``check_values``).
    """
    convert = result_converter(cache)
    c = to_torch(cache, "cache")
    ids = to_torch(block_ids, "block_ids")
    dim = normalize_dim(block_dim, c.dim())
    check_block_ids(c, ids, dim, unique=False, check_values=want_value_checks(check_values))
    return convert(
        eager_or_op(_gather_blocks_op, _gather_blocks_impl)(
            c, ids, dim, should_use_triton(c.device, use_triton)
        )
    )


def scatter_blocks(
    cache: Any,
    block_ids: Any,
    src: Any,
    *,
    block_dim: int = 0,
    use_triton: bool | None = None,
    check_values: bool = True,
) -> None:
    """In place: ``cache.select(block_dim, block_ids[i]) = src.select(block_dim, i)``.

    The inverse of ``gather_blocks``: ``src`` has the cache's shape with ``block_dim`` resized
    to ``len(block_ids)`` and the cache's dtype. Out-of-range or repeated ids raise
    ``ValueError`` (``check_values``).
    """
    c = to_torch(cache, "cache")
    ids = to_torch(block_ids, "block_ids")
    s = to_torch(src, "src")
    dim = normalize_dim(block_dim, c.dim())
    check_block_ids(c, ids, dim, unique=True, check_values=want_value_checks(check_values))
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"src: expected a tensor, got {type(s)!r}")
    expected = list(c.shape)
    expected[dim] = ids.shape[0]
    if list(s.shape) != expected:
        raise ValueError(f"src: expected shape {tuple(expected)}, got {tuple(s.shape)}")
    if s.dtype != c.dtype:
        raise TypeError(f"src: expected dtype {c.dtype} (the cache's), got {s.dtype}")
    if s.device != c.device:
        raise ValueError(f"src: expected device {c.device}, got {s.device}")
    eager_or_op(_scatter_blocks_op, _scatter_blocks_impl)(
        c, ids, s, dim, should_use_triton(c.device, use_triton)
    )
