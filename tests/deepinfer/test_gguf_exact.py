"""A GGUF model runs on its file's exact weights: same greedy tokens and logits as transformers
loading the same file in fp32 (``gguf_file=``, which dequantises with the ``gguf`` package)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_helpers import greedy_paged, one_thread
from quant_helpers import quant_config, write_quant_gguf

from deepinfer.models import AttentionMetadata, KVPool
from deepinfer.models.gguf_loader import load_gguf_state_dict, open_gguf
from deepinfer.models.gguf_model import load_gguf_model
from deepinfer.models.quant_layers import QuantEmbedding, QuantLinear

transformers = pytest.importorskip("transformers")

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)

# A mix like llama.cpp's: every supported block format on some projection, several per layer
# (the fused QKV joins Q4_K, Q5_K and Q6_K rows), a Q8_0 table.
MIXES = {
    "legacy": {"attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "Q8_0", "attn_output": "Q4_1",
               "ffn_gate": "Q4_0", "ffn_up": "Q4_1", "ffn_down": "Q8_0",
               "token_embd": "Q8_0"},
    "k-quants": {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
                 "ffn_gate": "Q5_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K",
                 "token_embd": "Q6_K", "output": "Q4_K"},
    "floats": {"attn_q": "F16", "attn_k": "BF16", "attn_v": "F32", "attn_output": "F16",
               "ffn_gate": "BF16", "ffn_up": "F16", "ffn_down": "F32", "token_embd": "F16"},
}  # fmt: skip
PROMPTS = [[(7 * p + 3 * j) % 250 + 3 for j in range(3 + p % 9)] for p in range(20)]


def _paged_logits(model, ids: list[int]) -> torch.Tensor:
    pool = KVPool.for_model(model.config, 2, 16)
    attn = AttentionMetadata.build([pool.allocate(2)], [len(ids)], [len(ids)], 16)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), attn.positions(), attn, pool))


def _hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    # eos_token_id=None: transformers neither stops at EOS nor bans it (min_new_tokens would
    # suppress EOS, which plain argmax decoding does not).
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("mix", list(MIXES))
def test_greedy_and_logits_match_transformers_on_the_same_gguf(tmp_path: Path, mix: str) -> None:
    cfg = quant_config(tie_word_embeddings="output" not in MIXES[mix])
    path = write_quant_gguf(tmp_path / f"{mix}.gguf", cfg, MIXES[mix], seed=len(mix))
    ours = load_gguf_model(path)
    layer = ours.decoder_layers()[0]
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear)
    assert isinstance(layer.mlp.gate_up_proj, QuantLinear)
    assert isinstance(ours.embed_tokens, QuantEmbedding)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    for prompt in PROMPTS[:4]:
        with torch.inference_mode():
            ref = theirs(torch.tensor([prompt])).logits[0].float()
        torch.testing.assert_close(_paged_logits(ours, prompt), ref, atol=1e-4, rtol=0)
    for prompt in PROMPTS:
        assert greedy_paged(ours, prompt, 8) == _hf_greedy(theirs, prompt, 8), prompt


def test_block_weights_equal_gguf_dequantisation(tmp_path: Path) -> None:
    """Every projection's values are bit-identical to the gguf package's float loading."""
    cfg = quant_config()
    path = write_quant_gguf(tmp_path / "m.gguf", cfg, MIXES["k-quants"] | {"output": "F32"})
    model = load_gguf_model(path)
    reader = open_gguf(path)
    floats = load_gguf_state_dict(reader, cfg)
    layer = model.decoder_layers()[1]
    qkv = torch.cat([floats[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear)
    assert torch.equal(layer.self_attn.qkv_proj.dequantized(), qkv)
    emb = model.embed_tokens(torch.arange(cfg.vocab_size))
    assert torch.equal(emb, floats["model.embed_tokens.weight"])
    # Memory: the Q4_K/Q5_K/Q6_K bytes, not fp32 copies.
    fp32_bytes = qkv.numel() * 4
    assert layer.self_attn.qkv_proj.weight.numel() < fp32_bytes / 4
