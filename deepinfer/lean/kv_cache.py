"""One sequence's KV cache for the lean runtime: contiguous pages, committed only as written.

The C kernels read the engine's paged layout (``[num_blocks, block_size, Hkv, D]`` per layer
and K/V); one sequence owns every block here, in order, so its block table is ``0, 1, 2...``
and a token's slot is its position. The array spans the whole context
(``max_model_len`` tokens) as a private anonymous memory map, as the engine's pool
(``deepinfer.models.kv_pool.lazy_zeros``): the kernel hands out zero pages and the kernel writes
commit only the pages of the positions used (a 32-token generation at a 2k context commits a
few pages a layer, not the 2k tokens' worth). Not ``np.zeros``: under glibc's mmap threshold it
zero-fills heap memory; and the map is advised off transparent huge pages, which committed
2 MB per layer for the first token's K/V row (measured: 94 MB at a 2k context).
"""

from __future__ import annotations

import contextlib
import mmap

import numpy as np

BLOCK_SIZE = 16


class KVCache:
    """K/V of ``num_layers`` layers for up to ``max_tokens`` positions (see the module doc).

    Example::

        cache = KVCache(num_layers=30, max_tokens=2176, num_kv_heads=3, head_dim=64)
        k, v = cache.layer(0)  # [blocks, 16, 3, 64] fp32 views
    """

    def __init__(self, num_layers: int, max_tokens: int, num_kv_heads: int, head_dim: int) -> None:
        for name, value in (("num_layers", num_layers), ("max_tokens", max_tokens),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):  # fmt: skip
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        self.max_tokens = max_tokens
        self.num_blocks = -(-max_tokens // BLOCK_SIZE)
        shape = (num_layers, 2, self.num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
        size = int(np.prod(shape)) * 4
        self._region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        advice = getattr(mmap, "MADV_NOHUGEPAGE", None)  # Linux only
        if advice is not None:
            with contextlib.suppress(OSError):  # a kernel without THP refuses the advice
                self._region.madvise(advice)
        self.data = np.frombuffer(self._region, dtype=np.float32).reshape(shape)
        self.page_ids = np.arange(self.num_blocks, dtype=np.int64)

    def layer(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``i``'s ``(k_cache, v_cache)``, contiguous views."""
        return self.data[i, 0], self.data[i, 1]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)
