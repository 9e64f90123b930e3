"""What the loader does not implement is refused by name; rope_freqs and SentencePiece GGUF
tokenizers load."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer.models import LlamaConfig, RopeScaling
from deepinfer.models.gguf_loader import open_gguf
from deepinfer.models.loader import build_model, load_model
from deepinfer.models.rope import inverse_frequencies
from deepinfer.models.tokenizer import Tokenizer

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
}


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}, "model_type 'gemma'"),
        ({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}, "'qwen3_moe'"),
        ({"model_type": None, "architectures": ["Qwen3MoeForCausalLM"]}, "'Qwen3MoeForCausalLM'"),
        ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh'"),
        ({"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
        (
            {
                "model_type": "qwen2",
                "use_sliding_window": True,
                "sliding_window": 64,
                "layer_types": ["full_attention", "chunked_attention"],
            },
            "layer type 'chunked_attention'",
        ),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_type 'dynamic'"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_type 'linear'"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config (awq)"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ],
)
def test_unsupported_hf_settings_are_refused_by_name(changes: dict[str, Any], needle: str) -> None:
    cfg = {**LLAMA, **changes}
    with pytest.raises(ValueError, match="not supported") as info:
        LlamaConfig.from_hf_config(cfg)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": None},
        {"model_type": "mistral", "sliding_window": 4096},  # window covers the whole context
        {"model_type": "mistral", "sliding_window": 1024},  # sliding-window attention
        {"model_type": "qwen2", "sliding_window": 1024, "use_sliding_window": False},
        {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]},
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        {"rope_scaling": {"type": "default"}},
    ],
)
def test_supported_hf_settings_load(changes: dict[str, Any]) -> None:
    assert LlamaConfig.from_hf_config({**LLAMA, **changes}).num_layers == 2


def test_unexpected_hf_tensors_are_named() -> None:
    cfg = tiny_config()
    state = random_hf_state(cfg)
    state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(cfg.head_dim)
    with pytest.raises(ValueError, match="q_norm"):
        build_model(cfg, state)


def _f32_raw(values: np.ndarray) -> tuple[np.ndarray, Any]:
    data = np.ascontiguousarray(values, dtype=np.float32).reshape(1, -1)
    return data.view(np.uint8), gguf.GGMLQuantizationType.F32


def test_unknown_gguf_tensors_are_refused_by_name(tmp_path: Path) -> None:
    cfg = tiny_config()
    extra = {"blk.0.attn_q_norm.weight": _f32_raw(np.ones(cfg.head_dim))}
    path = write_tiny_gguf(tmp_path / "qk-norm.gguf", cfg, random_hf_state(cfg), extra_raw=extra)
    with pytest.raises(ValueError, match=r"'blk\.0\.attn_q_norm\.weight' is not implemented"):
        LlamaConfig.from_gguf_metadata(open_gguf(path))


def llama_cpp_rope_freqs(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """The ``rope_freqs`` tensor llama.cpp's converter writes for Llama-3.1 scaling, computed
    here independently in float64 from the Hugging Face parameters."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    old = scaling.original_max_position_embeddings
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(scaling.factor)
        else:
            smooth = (old / wavelen - scaling.low_freq_factor) / (
                scaling.high_freq_factor - scaling.low_freq_factor
            )
            out.append(1.0 / ((1 - smooth) / scaling.factor + smooth))
    return np.array(out)


def test_rope_freqs_tensor_is_applied(tmp_path: Path) -> None:
    # A short original context makes every regime (kept, divided, smoothed) appear at D = 8.
    scaling = RopeScaling(factor=8.0, original_max_position_embeddings=256)
    cfg = tiny_config(rope_theta=500000.0)
    head_dim = cfg.head_dim
    factors = llama_cpp_rope_freqs(head_dim, cfg.rope_theta, scaling)
    assert len(set(np.round(factors, 6))) >= 3
    state = random_hf_state(cfg, seed=9)
    path = write_tiny_gguf(
        tmp_path / "llama31.gguf", cfg, state, extra_raw={"rope_freqs.weight": _f32_raw(factors)}
    )
    read = LlamaConfig.from_gguf_metadata(open_gguf(path))
    assert read.rope_scaling is not None and read.rope_scaling.rope_type == "factors"
    ours = inverse_frequencies(head_dim, cfg.rope_theta, read.rope_scaling).double()
    hf = inverse_frequencies(head_dim, cfg.rope_theta, scaling).double()
    torch.testing.assert_close(ours, hf, rtol=1e-6, atol=0)
    plain = inverse_frequencies(head_dim, cfg.rope_theta).double()
    assert not torch.allclose(ours, plain)

    # End to end: the loaded model (through the converted directory's config.json) rotates
    # with the scaled frequencies.
    loaded = load_model(path, cache_dir=tmp_path / "cache", dtype=torch.float32)
    assert loaded.config.rope_scaling == read.rope_scaling
    torch.testing.assert_close(loaded.model.rope.inv_freq.double(), hf, rtol=1e-6, atol=0)


def test_rope_scaling_factors_must_match_head_dim() -> None:
    with pytest.raises(ValueError, match="head_dim / 2"):
        tiny_config(rope_scaling=RopeScaling(rope_type="factors", factors=(1.0, 2.0)))
    with pytest.raises(ValueError, match="finite and positive"):
        RopeScaling(rope_type="factors", factors=(1.0, 0.0))


def test_gguf_sliding_window_and_scaling_type_are_refused(tmp_path: Path) -> None:
    cfg = tiny_config()
    for key, value, needle in (
        ("llama.rope.scaling.type", "yarn", "'yarn'"),
        ("llama.attention.sliding_window", 64, "sliding_window = 64"),
    ):
        path = tmp_path / f"{needle.strip(chr(39))[:4]}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
        writer.add_block_count(cfg.num_layers)
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_head_count(cfg.num_heads)
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_tensor("token_embd.weight", np.zeros((cfg.vocab_size, 4), np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(ValueError, match="not supported") as info:
            LlamaConfig.from_gguf_metadata(open_gguf(path))
        assert needle in str(info.value)


# ---------------------------------------------------------------------- SentencePiece GGUF
SPACE = "\u2581"
PIECES = {  # piece -> score: SentencePiece scores, higher merges first
    SPACE: -1.0,
    "t": -2.0,
    "h": -2.1,
    "e": -2.2,
    "c": -2.3,
    "a": -2.4,
    "s": -2.5,
    "o": -2.6,
    "n": -2.7,
    "é": -2.8,
    "he": -3.0,
    SPACE + "t": -3.1,
    SPACE + "the": -3.2,
    "at": -3.3,
    SPACE + "c": -3.4,
    SPACE + "cat": -3.5,
    "on": -3.6,
    SPACE + "s": -3.7,
    SPACE + "th": -3.8,
    "ca": -3.9,
    SPACE + "ca": -4.0,
}
SPECIAL = ["<unk>", "<s>", "</s>"]  # types 2, 3, 3


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = list(SPECIAL) + [f"<0x{b:02X}>" for b in range(256)] + list(PIECES)
    scores = [0.0] * len(SPECIAL) + [0.0] * 256 + list(PIECES.values())
    types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
    return tokens, scores, types


def write_spm_gguf(path: Path, *, add_space_prefix: bool = True) -> Path:
    tokens, scores, types = spm_vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_space_prefix(add_space_prefix)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def spm_reference(text: str, *, add_space_prefix: bool = True) -> list[int]:
    """SentencePiece BPE as llama.cpp runs it: start from characters, repeatedly join the
    adjacent pair whose joined piece scores highest (leftmost on ties); pieces not in the
    vocabulary become their UTF-8 bytes."""
    if not text:  # llama.cpp adds no space piece to empty text
        return []
    tokens, scores, types = spm_vocab()
    ids = {t: i for i, t in enumerate(tokens) if types[i] == 1}
    symbols = list((" " + text if add_space_prefix else text).replace(" ", SPACE))
    while True:
        best: tuple[float, int] | None = None
        for i in range(len(symbols) - 1):
            joined = symbols[i] + symbols[i + 1]
            if joined in ids and (best is None or scores[ids[joined]] > best[0]):
                best = (scores[ids[joined]], i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    out: list[int] = []
    for sym in symbols:
        if sym in ids:
            out.append(ids[sym])
        else:
            out.extend(len(SPECIAL) + b for b in sym.encode("utf-8"))
    return out


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = write_spm_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf")
    return Tokenizer.from_gguf(open_gguf(path))


def test_sentencepiece_gguf_tokenizer_loads(spm: Tokenizer) -> None:
    tokens, _, _ = spm_vocab()
    assert (spm.bos_token_id, spm.eos_token_ids, spm.add_bos_token) == (1, (2,), True)
    ids = spm.encode("the cat", add_bos=False)
    assert [tokens[i] for i in ids] == [SPACE + "the", SPACE + "cat"]
    assert spm.encode("the cat")[0] == 1  # BOS by default, as SentencePiece models expect
    # "x" is not a piece: it falls back to its byte, and decodes back.
    assert [tokens[i] for i in spm.encode("x", add_bos=False)] == [SPACE, "<0x78>"]
    assert spm.decode(spm.encode("a cat é ✓")) == "a cat é ✓"
    # Special tokens written in the text are recognised; the text after one gets its space.
    assert spm.encode("<s>the", add_bos=False) == [1, *spm.encode("the", add_bos=False)]


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="thecaosné x✓ ", max_size=24))
def test_sentencepiece_matches_the_reference_merges(spm: Tokenizer, text: str) -> None:
    assert spm.encode(text, add_bos=False) == spm_reference(text)
    assert spm.decode(spm.encode(text)) == text


def test_sentencepiece_without_space_prefix(tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(
        open_gguf(write_spm_gguf(tmp_path / "np.gguf", add_space_prefix=False))
    )
    assert tok.encode("the cat", add_bos=False) == spm_reference("the cat", add_space_prefix=False)
    assert tok.decode(tok.encode("the cat")) == "the cat"


def test_sentencepiece_survives_save_and_reload(spm: Tokenizer, tmp_path: Path) -> None:
    spm.save(tmp_path)
    again = Tokenizer.from_file(tmp_path / "tokenizer.json")
    text = "the cats on the é sofa"
    assert again.encode(text) == spm.encode(text)
    assert again.decode(again.encode(text)) == text
    detok = again.detokenizer()
    pieces = "".join(detok.push(i) for i in again.encode(text, add_bos=False)) + detok.flush()
    assert pieces == text


def test_unsupported_gguf_tokenizer_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bert.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["a"])
    writer.add_tensor("token_embd.weight", np.zeros((1, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'bert' is not supported"):
        Tokenizer.from_gguf(open_gguf(path))


def test_model_files_without_weights_match_the_loaded_model(tmp_path: Path) -> None:
    from deepinfer.models.loader import load_model_files

    cfg = tiny_config()
    path = write_tiny_gguf(tmp_path / "tiny.gguf", cfg, random_hf_state(cfg))
    files = load_model_files(path, cache_dir=tmp_path / "cache")
    loaded = load_model(path, cache_dir=tmp_path / "cache")
    assert files.config == loaded.config and files.path == loaded.path
    assert files.tokenizer.encode("the cat") == loaded.tokenizer.encode("the cat")
    assert not hasattr(files, "model")
    with pytest.raises(ValueError, match=r"config\.json"):
        load_model_files(tmp_path)
