"""`LogitsProcessor`, the seam for a caller's own logits rewrite, is the kernel pipeline's
(``deepinfer_kernels.sampling.LogitsProcessor``, called by ``process_logits``); this import
path keeps working."""

from deepinfer_kernels.sampling import LogitsProcessor

__all__ = ["LogitsProcessor"]
