"""Launch-size choices shared by the verification, sampling and KV Triton kernels."""

from __future__ import annotations

import torch

from deepinfer_kernels.launch_configs import sampling_launch


def row_tiles(batch: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """``(BLOCK_B, BLOCK_V)``: rows per program and vocabulary chunk (the launch table's
    :func:`~deepinfer_kernels.launch_configs.sampling_launch`)."""
    launch = sampling_launch(batch, vocab, device.type == "cuda")
    return launch["BLOCK_B"], launch["BLOCK_V"]
