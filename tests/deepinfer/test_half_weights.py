"""bf16/fp16 safetensors checkpoints run in fp32 from their own dtype (#24 item 1).

The proof asked for: logits equal to transformers in fp32 over the same half-precision weights
(within 1e-4), the same greedy tokens, and each weight held once, in the checkpoint's dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_helpers import MERGES, SPECIALS, greedy_paged, one_thread, random_hf_state, tiny_config

from deepinfer.models import LlamaConfig, load_hf_dir, load_model, save_hf_dir
from deepinfer.models.convert import convert_gguf
from deepinfer.models.half_weights import build_own_dtype_model, half_block, runs_from_own_dtype
from deepinfer.models.layers import Linear
from deepinfer.models.quant_layers import QuantEmbedding, QuantLinear
from deepinfer.models.registry import default_model_path
from deepinfer_kernels.quant import QuantType

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)

IDS = [1, 9, 77, 150, 3, 3, 260, 42, 18, 99, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def _write_tokenizer(out: Path) -> None:
    from model_helpers import tiny_vocab
    from tokenizers import Tokenizer, models

    tokens, _ = tiny_vocab()
    merges = [tuple(m.split(" ")) for m in MERGES]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))  # type: ignore[arg-type]
    tok.add_special_tokens(SPECIALS)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))


def _checkpoint(tmp_path: Path, dtype: torch.dtype, **overrides: object) -> LlamaConfig:
    cfg = tiny_config(**overrides)
    save_hf_dir(tmp_path, cfg, random_hf_state(cfg, seed=23), dtype=dtype)
    _write_tokenizer(tmp_path)
    return cfg


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": False, "attention_bias": True}],
    ids=["tied", "untied-bias"],
)
def test_half_checkpoint_matches_transformers_fp32(
    tmp_path: Path, dtype: torch.dtype, overrides: dict[str, object]
) -> None:
    transformers = pytest.importorskip("transformers")
    _checkpoint(tmp_path, dtype, **overrides)
    loaded = load_model(tmp_path)  # fp32, the default
    model = loaded.model
    qtype = QuantType.BF16 if dtype == torch.bfloat16 else QuantType.F16
    layer = model.decoder_layers()[0]
    for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj):
        assert isinstance(proj, QuantLinear)
        assert {q for q, _ in proj.layout} == {qtype}
    assert isinstance(model.embed_tokens, QuantEmbedding) and model.embed_tokens.qtype == qtype
    theirs = transformers.LlamaForCausalLM.from_pretrained(
        str(tmp_path), dtype=torch.float32, local_files_only=True
    ).eval()
    ids = torch.tensor([IDS])
    with torch.inference_mode():
        ref = theirs(ids).logits[0].float()
        dense = model.compute_logits(model.forward_dense(ids)[0])[0]
    torch.testing.assert_close(dense, ref, atol=1e-4, rtol=0)
    # Decode steps (few-row kernel) and the prefill (dequantise-then-GEMM) agree too.
    ours = greedy_paged(model, IDS, 8)
    with torch.inference_mode():
        out = theirs.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None,
                              pad_token_id=0)  # fmt: skip
    assert ours == out[0, ids.shape[1] :].tolist()


def test_weights_are_the_checkpoint_tensors_held_once(tmp_path: Path) -> None:
    cfg = _checkpoint(tmp_path, torch.bfloat16, tie_word_embeddings=False)
    _, state = load_hf_dir(tmp_path)
    matrices = {n: t for n, t in state.items() if t.dim() == 2}
    vectors = {n: t for n, t in state.items() if t.dim() == 1}
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    model = build_own_dtype_model(cfg, state)
    # Unfused projections and the head are views of the loaded tensors (no copy at all).
    layer = model.decoder_layers()[1]
    assert layer.self_attn.o_proj.weight.data_ptr() == matrices[
        "model.layers.1.self_attn.o_proj.weight"].data_ptr()  # fmt: skip
    assert layer.mlp.down_proj.weight.data_ptr() == matrices[
        "model.layers.1.mlp.down_proj.weight"].data_ptr()  # fmt: skip
    assert model.lm_head is not None
    assert model.lm_head.weight.data_ptr() == matrices["lm_head.weight"].data_ptr()

    def held() -> int:
        return sum(t.nbytes for t in model.state_dict().values())

    # bf16 matrices at 2 bytes a weight, vectors widened to fp32: nothing else.
    want = sum(t.nbytes for t in matrices.values()) + 2 * sum(t.nbytes for t in vectors.values())
    assert held() == want
    # Running it (decode rows and a prefill past the few-row kernel) prepares no second copy.
    greedy_paged(model, IDS * 3, 3)
    assert held() == want
    for module in model.modules():
        if isinstance(module, Linear):
            assert not module.packed.is_packed and not module.packed.has_bf16


def test_fp32_checkpoints_and_half_compute_keep_the_float_path(tmp_path: Path) -> None:
    _checkpoint(tmp_path, torch.float32)
    fp32 = load_model(tmp_path).model
    proj = fp32.decoder_layers()[0].self_attn.o_proj
    assert not isinstance(proj, QuantLinear) and proj.weight.dtype == torch.float32
    _checkpoint(tmp_path, torch.bfloat16)
    bf16 = load_model(tmp_path, dtype=torch.bfloat16).model
    assert bf16.decoder_layers()[0].self_attn.o_proj.weight.dtype == torch.bfloat16
    state = {"w": torch.zeros(4, 4, dtype=torch.bfloat16)}
    assert runs_from_own_dtype(state, torch.float32, "cpu")
    assert not runs_from_own_dtype(state, torch.bfloat16, "cpu")
    assert not runs_from_own_dtype(state, torch.float32, "meta")
    assert not runs_from_own_dtype({"w": torch.zeros(4, 4)}, torch.float32, "cpu")


def test_half_block_is_a_view_and_refuses_other_tensors() -> None:
    w = torch.randn(6, 8).to(torch.bfloat16)
    block = half_block(w)
    assert block.qtype == QuantType.BF16 and block.shape == (6, 8)
    assert block.data.data_ptr() == w.data_ptr()
    with pytest.raises(ValueError, match="tensor"):
        half_block(torch.randn(6, 8))
    with pytest.raises(ValueError, match="tensor"):
        half_block(torch.randn(8).to(torch.float16))


@pytest.mark.slow
def test_embedded_bf16_copy_matches_transformers() -> None:
    """The embedded model's converted bf16 safetensors directory, a real bf16 checkpoint."""
    transformers = pytest.importorskip("transformers")
    try:
        model_dir = convert_gguf(default_model_path())
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    loaded = load_model(model_dir)
    assert isinstance(loaded.model.decoder_layers()[0].mlp.down_proj, QuantLinear)
    theirs = transformers.LlamaForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True
    ).eval()
    ids = loaded.tokenizer.encode("def reverse(s):\n    return")
    with torch.inference_mode():
        ref = theirs(torch.tensor([ids])).logits[0].float()
        dense = loaded.model.compute_logits(loaded.model.forward_dense(torch.tensor([ids]))[0])[0]
    torch.testing.assert_close(dense, ref, atol=1e-4, rtol=0)
    ours = greedy_paged(loaded.model, ids, 8)
    with torch.inference_mode():
        out = theirs.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                              eos_token_id=None, pad_token_id=0)  # fmt: skip
    assert ours == out[0, len(ids) :].tolist()
