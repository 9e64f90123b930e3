"""deepinfer_kernels: see docs/kernels.md.

Example::

    import deepinfer_kernels
    print(deepinfer_kernels.__version__)

    import torch
    from deepinfer_kernels import sample, speculative_verify

    p_t = torch.softmax(torch.randn(2, 4, 50), -1)  # target probs [B, G+1, V]
    drafts = torch.tensor([[7, 3, 9], [1, -1, -1]])  # padded beyond num_draft_tokens
    res = speculative_verify(drafts, None, p_t, torch.tensor([3, 1]))
    tokens = sample(torch.randn(2, 50), temperature=0.7, top_k=20, top_p=0.9)
"""

__version__ = "0.10.0"

from deepinfer_kernels.attention import (
    PagedAttentionPlan,
    merge_attention_states,
    paged_attention,
    paged_decode_attention,
    plan_paged_attention,
)
from deepinfer_kernels.kv import WriteKVPlan, gather_blocks, plan_write_kv, scatter_blocks, write_kv
from deepinfer_kernels.mla import mla_decode_attention, mla_paged_attention, write_latent_kv
from deepinfer_kernels.moe import fused_moe, moe_route
from deepinfer_kernels.quant import QuantType, QuantWeight, dequantize, quant_linear
from deepinfer_kernels.sampling import (
    apply_logit_bias,
    apply_penalties,
    apply_token_bitmask,
    gather_logprobs,
    sample,
    sampling_probs,
)
from deepinfer_kernels.verify import VerifyResult, greedy_verify, speculative_verify

__all__ = [
    "__version__",
    # paged attention
    "PagedAttentionPlan",
    "merge_attention_states",
    "paged_attention",
    "paged_decode_attention",
    "plan_paged_attention",
    # multi-head latent attention
    "mla_decode_attention",
    "mla_paged_attention",
    "write_latent_kv",
    # mixture of experts
    "fused_moe",
    "moe_route",
    # weights in GGUF block formats
    "QuantType",
    "QuantWeight",
    "dequantize",
    "quant_linear",
    # verification, sampling and KV movement
    "VerifyResult",
    "apply_logit_bias",
    "apply_penalties",
    "apply_token_bitmask",
    "WriteKVPlan",
    "gather_blocks",
    "gather_logprobs",
    "greedy_verify",
    "plan_write_kv",
    "sample",
    "sampling_probs",
    "scatter_blocks",
    "speculative_verify",
    "write_kv",
]
