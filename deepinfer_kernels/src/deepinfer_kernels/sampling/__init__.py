"""Token sampling with per-request temperature, top-k, top-p and min-p; penalties, logit bias
and token masks applied to logits before it (one pipeline per batch: ``process_logits``) (grammar masks from ``GrammarCompiler``);
log-probabilities gathered after it."""

from deepinfer_kernels.sampling.grammar import GrammarCompiler, GrammarMatcher
from deepinfer_kernels.sampling.logit_bias import apply_logit_bias, token_bitmask
from deepinfer_kernels.sampling.logits_pipe import (
    LogitsProcessor,
    RowTransforms,
    process_logits,
    rescue_dead_rows,
)
from deepinfer_kernels.sampling.logprobs import gather_logprobs
from deepinfer_kernels.sampling.penalties import apply_penalties, pad_token_ids, penalties_active
from deepinfer_kernels.sampling.per_row_generators import sample_with_generators
from deepinfer_kernels.sampling.sample import sample, sampling_probs
from deepinfer_kernels.sampling.structured import StructuredOutputsParams
from deepinfer_kernels.sampling.token_mask import apply_token_bitmask, unpack_bitmask

__all__ = [
    "GrammarCompiler",
    "GrammarMatcher",
    "LogitsProcessor",
    "RowTransforms",
    "StructuredOutputsParams",
    "apply_logit_bias",
    "apply_penalties",
    "apply_token_bitmask",
    "gather_logprobs",
    "pad_token_ids",
    "penalties_active",
    "process_logits",
    "rescue_dead_rows",
    "sample",
    "sample_with_generators",
    "sampling_probs",
    "token_bitmask",
    "unpack_bitmask",
]
