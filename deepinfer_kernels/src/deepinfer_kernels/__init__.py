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

__version__ = "0.13.0"

import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deepinfer_kernels.attention import (
        PagedAttentionPlan,
        merge_attention_states,
        paged_attention,
        paged_decode_attention,
        plan_paged_attention,
    )
    from deepinfer_kernels.kv import (
        WriteKVPlan,
        gather_blocks,
        plan_write_kv,
        scatter_blocks,
        write_kv,
    )
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

# PEP 562 lazy re-exports ({name: subpackage}): ``import deepinfer_kernels`` loads no torch, so
# a torch-free process can use the C kernels (``deepinfer_kernels.cpu.numpy_ops``); each torch
# subpackage (and its torch.library ops) loads with the first name taken from it.
_EXPORTS = {
    "PagedAttentionPlan": "attention",
    "merge_attention_states": "attention",
    "paged_attention": "attention",
    "paged_decode_attention": "attention",
    "plan_paged_attention": "attention",
    "WriteKVPlan": "kv",
    "gather_blocks": "kv",
    "plan_write_kv": "kv",
    "scatter_blocks": "kv",
    "write_kv": "kv",
    "mla_decode_attention": "mla",
    "mla_paged_attention": "mla",
    "write_latent_kv": "mla",
    "fused_moe": "moe",
    "moe_route": "moe",
    "QuantType": "quant",
    "QuantWeight": "quant",
    "dequantize": "quant",
    "quant_linear": "quant",
    "apply_logit_bias": "sampling",
    "apply_penalties": "sampling",
    "apply_token_bitmask": "sampling",
    "gather_logprobs": "sampling",
    "sample": "sampling",
    "sampling_probs": "sampling",
    "VerifyResult": "verify",
    "greedy_verify": "verify",
    "speculative_verify": "verify",
}
_SUBPACKAGES = frozenset(
    {"attention", "cpu", "kv", "mla", "moe", "quant", "reference", "sampling", "testing", "verify"}
)


def __getattr__(name: str) -> Any:
    package = _EXPORTS.get(name)
    if package is not None:
        value = getattr(import_module(f"{__name__}.{package}"), name)
    elif name in _SUBPACKAGES:
        value = import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def register_torch_ops() -> None:
    """Import every subpackage that registers ``torch.library`` ops (``torch.ops.deepinfer.*``;
    taking any name from one of them does it too)."""
    for package in ("attention", "cpu.ops", "cpu.quant_layer_ops", "cpu.dspark_draft",
                    "cpu.causal_attention_op", "kv", "mla", "moe", "quant.ops", "sampling",
                    "verify"):  # fmt: skip
        import_module(f"{__name__}.{package}")


if "torch" in sys.modules:
    # A process that already runs torch gets the ops registered on import, as before the
    # re-exports were lazy (code calls ``torch.ops.deepinfer.*`` after a bare import); a
    # process without torch (the lean CPU runtime) stays without it.
    register_torch_ops()


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
