"""Token sampling with per-request temperature, top-k, top-p and min-p."""

from deepinfer_kernels.sampling.sample import sample, sampling_probs

__all__ = ["sample", "sampling_probs"]
