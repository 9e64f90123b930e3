"""Launch-size choices shared by the verification, sampling and KV Triton kernels."""

from __future__ import annotations

import torch
import triton

from deepinfer_kernels._dispatch import interpreter_active


def row_tiles(batch: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """``(BLOCK_B, BLOCK_V)``: rows per program and vocabulary chunk.

    On a GPU one program owns one row and streams the vocabulary in wide chunks. Under the
    interpreter (CPU tests) programs run one after another in Python, so each takes many rows.
    """
    if device.type == "cuda" and not interpreter_active():
        return 1, min(triton.next_power_of_2(vocab), 4096)
    block_b = min(triton.next_power_of_2(max(batch, 1)), 4096)
    return block_b, min(triton.next_power_of_2(vocab), 128)
