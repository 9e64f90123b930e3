"""Speculative (lossless rejection sampling) and greedy verification of draft blocks."""

from deepinfer_kernels.verify.greedy import greedy_verify
from deepinfer_kernels.verify.speculative import speculative_verify
from deepinfer_kernels.verify.types import VerifyResult

__all__ = ["VerifyResult", "greedy_verify", "speculative_verify"]
