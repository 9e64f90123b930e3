"""Readable torch implementations of every public op: the specification the kernels meet."""

from deepinfer_kernels.reference.attention import (
    merge_attention_states as merge_attention_states_reference,
)
from deepinfer_kernels.reference.attention import paged_attention as paged_attention_reference
from deepinfer_kernels.reference.attention import (
    paged_decode_attention as paged_decode_attention_reference,
)
from deepinfer_kernels.reference.cpu import (
    add_rms_norm_reference,
    bf16_weight_linear_reference,
    block_rows_reference,
    decoder_mlp_reference,
    decoder_qkv_reference,
    quant_decoder_mlp_reference,
    quant_decoder_qkv_reference,
    rms_norm_reference,
    unpack_panels_reference,
)
from deepinfer_kernels.reference.kv import (
    gather_blocks_reference,
    scatter_blocks_reference,
    write_kv_reference,
)
from deepinfer_kernels.reference.logits import (
    apply_logit_bias_reference,
    gather_logprobs_reference,
)
from deepinfer_kernels.reference.logits_pipe import (
    process_logits_reference,
    rescue_dead_rows_reference,
)
from deepinfer_kernels.reference.mla import mla_paged_attention as mla_paged_attention_reference
from deepinfer_kernels.reference.mla import write_latent_kv as write_latent_kv_reference
from deepinfer_kernels.reference.moe import fused_moe as fused_moe_reference
from deepinfer_kernels.reference.moe import moe_route as moe_route_reference
from deepinfer_kernels.reference.penalties import (
    apply_penalties_reference,
    apply_token_bitmask_reference,
)
from deepinfer_kernels.reference.quant import (
    dequantize_reference,
    quant_linear_reference,
    quant_swiglu_reference,
)
from deepinfer_kernels.reference.sampling import sample_reference, sampling_probs_reference
from deepinfer_kernels.reference.verify import (
    greedy_verify_reference,
    speculative_verify_reference,
)

__all__: list[str] = [
    # paged attention
    "merge_attention_states_reference",
    "paged_attention_reference",
    "paged_decode_attention_reference",
    # multi-head latent attention
    "mla_paged_attention_reference",
    "write_latent_kv_reference",
    # mixture of experts
    "fused_moe_reference",
    "moe_route_reference",
    # compiled CPU ops
    "add_rms_norm_reference",
    "bf16_weight_linear_reference",
    "decoder_mlp_reference",
    "decoder_qkv_reference",
    "quant_decoder_mlp_reference",
    "quant_decoder_qkv_reference",
    "block_rows_reference",
    "rms_norm_reference",
    "unpack_panels_reference",
    # weights in GGUF block formats
    "dequantize_reference",
    "quant_linear_reference",
    "quant_swiglu_reference",
    # verification, sampling and KV movement
    "apply_logit_bias_reference",
    "apply_penalties_reference",
    "gather_logprobs_reference",
    "process_logits_reference",
    "rescue_dead_rows_reference",
    "apply_token_bitmask_reference",
    "gather_blocks_reference",
    "greedy_verify_reference",
    "sample_reference",
    "sampling_probs_reference",
    "scatter_blocks_reference",
    "speculative_verify_reference",
    "write_kv_reference",
]
