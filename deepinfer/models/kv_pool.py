"""The engine's paged KV pool: one tensor for all layers plus a ref-counted block allocator.

The tensor is zero but lazily committed on CPU (:func:`lazy_zeros`): memory grows with the
blocks written, not the pool's size. :func:`blocks_for_memory` and :func:`blocks_for_context`
size a pool from a byte budget or a context limit.
"""

from __future__ import annotations

import contextlib
import math
import mmap
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from deepinfer.models.config import LlamaConfig

if TYPE_CHECKING:
    from deepinfer.models.llama import LlamaModel


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than an allocation asked for."""


def lazy_zeros(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """A zero tensor whose CPU memory is committed only where it is written.

    ``torch.zeros`` writes every byte at start (a 2048-block SmolLM2 pool: 1.44 GB resident
    before the first request). On CPU the tensor is a private anonymous memory map of its own:
    the kernel hands out zero pages, and a page becomes resident when a block in it is first
    written. Not ``calloc`` (``np.zeros``): glibc serves it from the heap, and zero-fills it,
    whenever the size is under its mmap threshold, which grows with what the process freed
    before; after loading the weights a 137-block (101 MB) pool was committed whole. Small
    tensors and other devices get ``torch.zeros``.
    """
    size = torch.empty((), dtype=dtype).element_size() * math.prod(shape)
    if torch.device(device).type != "cpu" or size < _LAZY_MIN_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    _no_huge_pages(region)
    # torch.frombuffer keeps ``region`` alive as long as any view of the tensor lives.
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(shape)


# Below a page's worth there is nothing to leave uncommitted.
_LAZY_MIN_BYTES = 1 << 16


def _no_huge_pages(region: mmap.mmap) -> None:
    """Ask Linux not to back ``region`` with transparent huge pages: a block's K/V rows lie in
    ``2 * num_layers`` places, and with 2 MB pages the first block written would commit
    ``2 * num_layers * 2 MB`` (120 MB for SmolLM2) instead of a few 4 kB pages each."""
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)  # Linux only
    if advice is None:
        return
    # mmap's constant, not a literal: 14 is MADV_HUGEPAGE, which asked for the opposite (each
    # block written then committed 2 MB pages: 238 MB after a 10-token prompt). Advice only: a
    # kernel without THP refuses it, and the pool works either way.
    with contextlib.suppress(OSError):
        region.madvise(advice)


def blocks_for_memory(
    config: LlamaConfig, nbytes: int, block_size: int = 16, dtype: torch.dtype = torch.float32
) -> int:
    """How many KV blocks of ``block_size`` tokens fit in ``nbytes`` (at least 1)."""
    if nbytes <= 0:
        raise ValueError(f"kv memory must be > 0 bytes, got {nbytes}")
    per_block = bytes_per_block(config, block_size, dtype)
    if nbytes < per_block:
        raise ValueError(
            f"kv memory {nbytes} B is less than one block ({per_block} B for {block_size} tokens)"
        )
    return nbytes // per_block


def blocks_for_context(max_model_len: int, max_num_seqs: int, block_size: int = 16) -> int:
    """Blocks for one request of ``max_model_len`` tokens, plus one per other batch slot (their
    current block): a pool sized for the context limit rather than a fixed count."""
    if max_model_len < 1 or max_num_seqs < 1:
        raise ValueError("max_model_len and max_num_seqs must be >= 1")
    return -(-max_model_len // block_size) + max_num_seqs


def bytes_per_block(config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of KV (K and V, or an MLA model's latent) takes across all layers."""
    size = torch.empty((), dtype=dtype).element_size()
    planes, heads, width = config.kv_page_layout()
    return config.num_layers * planes * block_size * heads * width * size


class KVPool:
    """Paged KV storage ``[num_layers, planes, num_blocks, block_size, num_kv_heads, head_dim]``.

    ``planes`` is 2 (K and V) for standard attention; an MLA model (DeepSeek-V2/V3) caches one
    latent per token: one plane of one head, ``kv_lora_rank + qk_rope_head_dim`` wide
    (:meth:`latent_cache`). Either way dimension 2 is the block dimension, so the prefix cache
    and PD transfer move latent pages exactly as they move K/V pages.

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
        planes: int = 2,
    ) -> None:
        for name, value in (
            ("planes", planes),
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
        self.tensor = lazy_zeros(
            (num_layers, planes, num_blocks, block_size, num_kv_heads, head_dim), dtype, device
        )
        # Per-layer (K, V) views made once: indexing the 6-d tensor per layer per step costs
        # more than the decode attention of a short sequence on CPU. A one-plane (latent) pool
        # has a single view per layer; its "K" and "V" are the same latent.
        self._layer_views = [(layer[0], layer[-1]) for layer in self.tensor.unbind(0)]
        self._ref = [0] * num_blocks
        # A stack, lowest id on top: a fresh pool hands out 0, 1, 2, ... and a freed block is
        # the next one handed out again. The pool's pages are committed on first write, so
        # reusing the blocks written most recently keeps the resident part at the most blocks
        # ever in use at once; a FIFO list walked every block of the pool in turn, and a long
        # run (the demo's prompts loaded from the disk tier) touched 0.5 GB more of it.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

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
        planes, heads, width = config.kv_page_layout()
        return cls(
            config.num_layers,
            num_blocks,
            block_size,
            heads,
            width,
            dtype=dtype,
            device=device,
            planes=planes,
        )

    @classmethod
    def for_weights(cls, model: LlamaModel, num_blocks: int, block_size: int = 16) -> KVPool:
        """A pool for ``model`` in the dtype and on the device of its weights (its norms':
        a GGUF model's projections and table hold block bytes)."""
        weight = model.norm.weight
        return cls.for_model(
            model.config, num_blocks, block_size, dtype=weight.dtype, device=weight.device
        )

    # ------------------------------------------------------------------ views
    @property
    def num_layers(self) -> int:
        return int(self.tensor.shape[0])

    @property
    def page_layout(self) -> tuple[int, int, int]:
        """``(planes, heads, width)`` of one token in one layer."""
        _, planes, _, _, heads, width = self.tensor.shape
        return int(planes), int(heads), int(width)

    def latent_cache(self, layer: int) -> torch.Tensor:
        """An MLA pool's latent cache of ``layer``: ``[num_blocks, block_size, width]``."""
        if self.page_layout[:2] != (1, 1):
            raise ValueError(
                f"latent_cache needs a one-plane, one-head (MLA) pool; this one is "
                f"{self.page_layout} (planes, heads, width)"
            )
        return self._layer_views[layer][0][:, :, 0]

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
        blocks = [self._free.pop() for _ in range(n)]
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
