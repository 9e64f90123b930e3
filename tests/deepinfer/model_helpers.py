"""Tiny random Llama models, byte-level BPE vocabularies and GGUF files built at test time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from deepinfer.models import LlamaConfig
from deepinfer.models.gguf_loader import permute_rotary

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a t"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_alphabet() -> list[str]:
    """The 256 printable stand-ins that byte-level BPE uses for raw bytes, in a fixed order."""
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


def tiny_vocab() -> tuple[list[str], list[int]]:
    """Tokens (specials first, then bytes, then merge results) and llama.cpp token types."""
    tokens = list(SPECIALS) + byte_alphabet()
    for merge in MERGES:
        merged = merge.replace(" ", "")
        if merged not in tokens:
            tokens.append(merged)
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types


def tiny_config(**overrides: object) -> LlamaConfig:
    tokens, _ = tiny_vocab()
    base: dict[str, object] = {
        "vocab_size": len(tokens),
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_ids": (2,),
    }
    base.update(overrides)
    return LlamaConfig(**base)  # type: ignore[arg-type]


def random_hf_state(config: LlamaConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under HF names, scaled so activations stay O(1) through the layers."""
    gen = torch.Generator().manual_seed(seed)
    h, i, q, kv = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size

    def rand(*shape: int, scale: float | None = None) -> torch.Tensor:
        s = scale if scale is not None else shape[-1] ** -0.5
        return torch.randn(*shape, generator=gen) * s

    state = {
        "model.embed_tokens.weight": rand(config.vocab_size, h, scale=1.0),
        "model.norm.weight": 1 + 0.1 * rand(h, scale=1.0),
    }
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        state.update(
            {
                p + "self_attn.q_proj.weight": rand(q, h),
                p + "self_attn.k_proj.weight": rand(kv, h),
                p + "self_attn.v_proj.weight": rand(kv, h),
                p + "self_attn.o_proj.weight": rand(h, q),
                p + "mlp.gate_proj.weight": rand(i, h),
                p + "mlp.up_proj.weight": rand(i, h),
                p + "mlp.down_proj.weight": rand(h, i),
                p + "input_layernorm.weight": 1 + 0.1 * rand(h, scale=1.0),
                p + "post_attention_layernorm.weight": 1 + 0.1 * rand(h, scale=1.0),
            }
        )
        if config.attention_bias:
            for name, size in (("q", q), ("k", kv), ("v", kv)):
                state[p + f"self_attn.{name}_proj.bias"] = rand(size, scale=0.1)
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = rand(config.vocab_size, h)
    return state


_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def write_tiny_gguf(
    path: Path,
    config: LlamaConfig,
    state: dict[str, torch.Tensor],
    *,
    quantize_embedding: bool = False,
    chat_template: str | None = CHAT_TEMPLATE,
    extra_raw: dict[str, tuple[np.ndarray, Any]] | None = None,
) -> Path:
    """Write ``state`` as llama.cpp would: GGUF names, Q/K rows permuted, tokenizer metadata.

    ``extra_raw``: more tensors by GGUF name, as ``(uint8 bytes [rows, row_bytes], GGML type)``
    written as they are (already in llama.cpp's row order)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-test-llama")
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    tokens, types = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    for name, tensor in state.items():
        arr = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"
            if module == "self_attn.q_proj":
                arr = permute_rotary(torch.from_numpy(arr), config.num_heads).numpy()
            elif module == "self_attn.k_proj":
                arr = permute_rotary(torch.from_numpy(arr), config.num_kv_heads).numpy()
        if gname == "token_embd.weight" and quantize_embedding:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(gname, gguf.quants.quantize(arr, q8), raw_dtype=q8)
        else:
            writer.add_tensor(gname, np.ascontiguousarray(arr, dtype=np.float32))
    for gname, (raw, kind) in (extra_raw or {}).items():
        writer.add_tensor(gname, raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def dense_reference_logits(
    config: LlamaConfig, state: dict[str, torch.Tensor], ids: list[int]
) -> torch.Tensor:
    """Logits ``[S, V]`` of one sequence by a from-scratch fp64 Llama written out plainly here,
    independent of deepinfer's modules (HF rotate-half RoPE, GQA by repeating K/V heads)."""
    d = {k: v.double() for k, v in state.items()}
    hd, nh, nkv = config.head_dim, config.num_heads, config.num_kv_heads
    s = len(ids)

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + config.rms_norm_eps)

    inv = 1.0 / config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rope(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = d["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.full((s, s), float("-inf"), dtype=torch.float64).triu(1)
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        h = norm(x, d[p + "input_layernorm.weight"])

        def proj(name: str, heads: int, h: torch.Tensor = h, p: str = p) -> torch.Tensor:
            out = h @ d[p + f"self_attn.{name}_proj.weight"].T
            if p + f"self_attn.{name}_proj.bias" in d:
                out = out + d[p + f"self_attn.{name}_proj.bias"]
            return out.view(s, heads, hd)

        q, k, v = rope(proj("q", nh)), rope(proj("k", nkv)), proj("v", nkv)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        att = torch.einsum("qhd,khd->hqk", q, k) / hd**0.5 + mask
        o = torch.einsum("hqk,khd->qhd", att.softmax(-1), v).reshape(s, nh * hd)
        x = x + o @ d[p + "self_attn.o_proj.weight"].T
        h = norm(x, d[p + "post_attention_layernorm.weight"])
        gate = h @ d[p + "mlp.gate_proj.weight"].T
        up = h @ d[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ d[p + "mlp.down_proj.weight"].T
    x = norm(x, d["model.norm.weight"])
    head = d.get("lm_head.weight", d["model.embed_tokens.weight"])
    return x @ head.T


def greedy_paged(model, prompt: list[int], max_new: int, eos: tuple[int, ...] = ()) -> list[int]:
    """Greedy decoding through the paged path: one prefill forward, then one token per step."""
    from deepinfer.models import AttentionMetadata, KVPool

    block = 16
    pool = KVPool.for_model(
        model.config,
        -(-(len(prompt) + max_new) // block),
        block,
        dtype=model.norm.weight.dtype,  # the embedding may hold GGUF block bytes
    )
    table = pool.allocate(pool.num_blocks)
    out: list[int] = []
    feed, done = list(prompt), 0
    with torch.inference_mode():
        while len(out) < max_new:
            attn = AttentionMetadata.build([table], [done + len(feed)], [len(feed)], block)
            hidden = model(torch.tensor(feed), attn.positions(), attn, pool)
            token = int(model.compute_logits(hidden[-1]).argmax())
            done += len(feed)
            out.append(token)
            if token in eos:
                break
            feed = [token]
    return out


def one_thread():
    """Generator for a fixture: torch on one thread, restored afterwards.

    The real-model tests run many small decode steps; on a shared 2-core runner (``pytest -n 2``)
    two intra-op threads per worker only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def built(kernel: Any) -> Any:
    """``kernel`` (a compiled CPU kernel handle) once built. Skips the test on a machine without
    a C compiler; on one with a compiler a failed build fails the test (it is a bug there)."""
    import pytest

    from deepinfer_kernels.cpu import compiler_available

    if not compiler_available():
        pytest.skip("no C compiler on this machine")
    ok = kernel.available()
    assert ok, getattr(kernel, "error", None) or getattr(getattr(kernel, "fn", None), "error", None)
    return kernel
