"""Token sampling with per-request temperature, top-k, top-p and min-p; penalties and token
masks applied to logits before it."""

from deepinfer_kernels.sampling.penalties import apply_penalties, pad_token_ids
from deepinfer_kernels.sampling.sample import sample, sampling_probs
from deepinfer_kernels.sampling.token_mask import apply_token_bitmask, unpack_bitmask

__all__ = [
    "apply_penalties",
    "apply_token_bitmask",
    "pad_token_ids",
    "sample",
    "sampling_probs",
    "unpack_bitmask",
]
