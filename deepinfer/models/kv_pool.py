"""The engine's paged KV pool: one tensor for all layers plus a ref-counted block allocator."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from deepinfer.models.config import LlamaConfig

if TYPE_CHECKING:
    from deepinfer.models.llama import LlamaModel


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than an allocation asked for."""


class KVPool:
    """Paged KV storage ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``.

    ``pool.k_cache(l)`` / ``pool.v_cache(l)`` are views ``[num_blocks, block_size, Hkv, D]`` in the
    layout of DESIGN.md; dimension 2 of :attr:`tensor` is the block dimension that the cache
    package's adapter moves pages along. Blocks are handed out by :meth:`allocate` and returned
    when their reference count drops to zero (shared prefix blocks are :meth:`share`-d).

    Example::

        pool = KVPool.for_model(cfg, num_blocks=64, block_size=16)
        blocks = pool.allocate(3)
        pool.free(blocks)
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.tensor = torch.zeros(
            (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim),
            dtype=dtype,
            device=device,
        )
        # Per-layer (K, V) views made once: indexing the 6-d tensor per layer per step costs
        # more than the decode attention of a short sequence on CPU.
        self._layer_views = [(layer[0], layer[1]) for layer in self.tensor.unbind(0)]
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @classmethod
    def for_model(
        cls,
        config: LlamaConfig,
        num_blocks: int,
        block_size: int = 16,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVPool:
        return cls(
            config.num_layers,
            num_blocks,
            block_size,
            config.num_kv_heads,
            config.head_dim,
            dtype=dtype,
            device=device,
        )

    @classmethod
    def for_weights(cls, model: LlamaModel, num_blocks: int, block_size: int = 16) -> KVPool:
        """A pool for ``model`` in the dtype and on the device of its weights."""
        weight = model.embed_tokens.weight
        return cls.for_model(
            model.config, num_blocks, block_size, dtype=weight.dtype, device=weight.device
        )

    # ------------------------------------------------------------------ views
    @property
    def num_layers(self) -> int:
        return int(self.tensor.shape[0])

    def k_cache(self, layer: int) -> torch.Tensor:
        return self._layer_views[layer][0]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self._layer_views[layer][1]

    def layer_caches(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache)`` of ``layer``, each ``[num_blocks, block_size, Hkv, D]``."""
        return self._layer_views[layer]

    @property
    def bytes_per_block(self) -> int:
        return self.tensor[:, :, 0].numel() * self.tensor.element_size()

    # ------------------------------------------------------------------ allocator
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks (reference count 1 each)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n > len(self._free):
            raise OutOfBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self._ref[b] = 1
        return blocks

    def share(self, blocks: Iterable[int]) -> None:
        """Add one reference to each (already allocated) block, e.g. a shared prefix."""
        blocks = list(blocks)
        for b in blocks:
            self._check(b)
            if self._ref[b] == 0:
                raise ValueError(f"block {b} is free and cannot be shared")
        for b in blocks:
            self._ref[b] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block; blocks reaching zero go back to the free list."""
        blocks = list(blocks)
        for b in blocks:
            self._check(b)
            if self._ref[b] == 0:
                raise ValueError(f"block {b} is already free")
        for b in blocks:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free.append(b)

    def ref_count(self, block: int) -> int:
        self._check(block)
        return self._ref[block]

    def _check(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id {block} is outside [0, {self.num_blocks})")
