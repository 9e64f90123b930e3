"""Tiny random checkpoints of each supported family, written by transformers' own classes.

Each directory holds what a Hugging Face repo holds (``config.json``, ``model.safetensors``,
``tokenizer.json`` built with the ``tokenizers`` library, ``tokenizer_config.json`` with a chat
template), so the engine loads it exactly as it would a downloaded model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from model_helpers import CHAT_TEMPLATE, MERGES, SPECIALS, tiny_vocab

COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    # Wider than HF's 0.02 so the logits spread: greedy choices are then far from ties that
    # float rounding (1e-6) could flip, and the token-identity check means something.
    "initializer_range": 0.2,
    "bos_token_id": None,
    "eos_token_id": None,
}

# (transformers class name, config class name, extra config) per family.
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {"head_dim": 16, "tie_word_embeddings": True}),
    # A window shorter than prompt + output: positions past it must not see the oldest keys.
    "mistral": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 12}),
    # MLA (low-rank Q, latent KV), a dense first layer then MoE layers with a shared expert,
    # grouped top-k over 8 experts (sigmoid + correction bias), YaRN rope with DeepSeek's mscale.
    "deepseek_v3": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        {
            "num_hidden_layers": 3,
            "num_key_value_heads": 4,
            "kv_lora_rank": 32,
            "q_lora_rank": 48,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_group": 4,
            "topk_group": 2,
            "first_k_dense_replace": 1,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    ),
    # V2: full-rank Q projection, softmax routing with group-limited greedy top-k.
    "deepseek_v2": (
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
        {
            "num_hidden_layers": 3,
            "num_key_value_heads": 4,
            "kv_lora_rank": 32,
            "q_lora_rank": None,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "n_routed_experts": 8,
            "n_shared_experts": 2,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 16,
            "n_group": 4,
            "topk_group": 2,
            "topk_method": "group_limited_greedy",
            "first_k_dense_replace": 1,
        },
    ),
}


def write_tokenizer(out: Path) -> None:
    """A byte-level BPE ``tokenizer.json`` over :func:`model_helpers.tiny_vocab`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens, _ = tiny_vocab()
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in MERGES]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))  # type: ignore[arg-type]
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    tok.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    tok.add_special_tokens(SPECIALS)
    tok.save(str(out / "tokenizer.json"))
    meta = {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(meta), encoding="utf-8")


def build_checkpoint(family: str, out: Path, seed: int = 0, **extra: Any) -> torch.nn.Module:
    """Save a random ``family`` model (fp32) with its tokenizer into ``out``; returns the
    transformers model, in eval mode."""
    import transformers

    model_cls, config_cls, family_extra = FAMILIES.get(family, (None, None, {}))
    if model_cls is None or config_cls is None:
        raise KeyError(family)
    tokens, _ = tiny_vocab()
    config = getattr(transformers, config_cls)(
        vocab_size=len(tokens), **{**COMMON, **family_extra, **extra}
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, tensor in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                tensor.normal_(0.0, 0.1)  # HF starts it at zero: make it change choices
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    write_tokenizer(out)
    return model


def prompts(vocab: int, count: int = 10, seed: int = 3) -> list[list[int]]:
    """``count`` prompts of 1..~30 ordinary (non-special) tokens."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [1 + (7 * i) % 29 for i in range(count)]
    return [torch.randint(len(SPECIALS), vocab, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model: torch.nn.Module, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """transformers' own ``generate`` (greedy, no EOS: the configs define none), all prompts
    in one left-padded batch."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return [[int(t) for t in row[width:]] for row in out]
