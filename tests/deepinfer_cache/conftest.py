from __future__ import annotations

import torch

PAGE = (2, 2, 4, 3)  # [layers, K/V, block_size, head_dim]: tiny pages
BLOCK = 2


def page_bytes(page: tuple[int, ...] = PAGE, dtype: torch.dtype = torch.float32) -> int:
    n = 1
    for s in page:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


def make_pages(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((n, *PAGE), generator=g).to(dtype)
