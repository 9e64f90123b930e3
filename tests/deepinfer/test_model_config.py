"""LlamaConfig validation, HF config.json round trip and RoPE scaling."""

from __future__ import annotations

import math

import pytest
import torch

from deepinfer.models import LlamaConfig, RopeScaling
from deepinfer.models.rope import RotaryEmbedding, inverse_frequencies

BASE = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
}


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    cfg = LlamaConfig(**BASE)
    assert cfg.head_dim == 16 and cfg.q_size == 64 and cfg.kv_size == 32


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"vocab_size": 0}, "vocab_size"),
        ({"num_layers": -1}, "num_layers"),
        ({"num_heads": 3, "hidden_size": 64}, "divisible"),
        ({"num_kv_heads": 3}, "multiple of num_kv_heads"),
        ({"head_dim": 7}, "even"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"rope_theta": float("nan")}, "rope_theta"),
        ({"eos_token_ids": (100,)}, "outside"),
        ({"bos_token_id": -1}, "outside"),
    ],
)
def test_invalid_configs_raise(change: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LlamaConfig(**{**BASE, **change})  # type: ignore[arg-type]


def test_hf_config_round_trip() -> None:
    cfg = LlamaConfig(
        **BASE,
        head_dim=32,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=32.0, original_max_position_embeddings=8192),
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_ids=(2, 3),
    )
    assert LlamaConfig.from_hf_config(cfg.to_hf_config()) == cfg


def test_from_hf_config_reads_smollm_style_json() -> None:
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "rms_norm_eps": 1e-05,
        "rope_theta": 100000,
        "tie_word_embeddings": True,
        "vocab_size": 49152,
        "eos_token_id": 2,
        "bos_token_id": 1,
        "rope_scaling": None,
    }
    cfg = LlamaConfig.from_hf_config(raw)
    assert (cfg.head_dim, cfg.eos_token_ids, cfg.rope_scaling) == (64, (2,), None)
    with pytest.raises(ValueError, match="hidden_size"):
        LlamaConfig.from_hf_config({k: v for k, v in raw.items() if k != "hidden_size"})


def test_qwen2_config_gets_qkv_bias() -> None:
    raw = {**BASE}
    hf = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "vocab_size": raw["vocab_size"],
    }
    assert LlamaConfig.from_hf_config(hf).attention_bias


def test_rope_scaling_validation() -> None:
    with pytest.raises(ValueError, match="rope_type"):
        RopeScaling(rope_type="longrope")
    with pytest.raises(ValueError, match="beta_slow"):
        RopeScaling(rope_type="yarn", beta_fast=1.0, beta_slow=32.0)
    with pytest.raises(ValueError, match="low_freq_factor"):
        RopeScaling(low_freq_factor=4.0, high_freq_factor=1.0)
    cfg = LlamaConfig(**BASE, rope_scaling={"rope_type": "llama3", "factor": 8.0})  # type: ignore[arg-type]
    assert isinstance(cfg.rope_scaling, RopeScaling)


def test_llama3_scaling_keeps_high_and_divides_low_frequencies() -> None:
    scaling = RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    )
    plain = inverse_frequencies(128, 500000.0)
    scaled = inverse_frequencies(128, 500000.0, scaling)
    wavelen = 2 * math.pi / plain
    high = wavelen < 8192 / 4
    low = wavelen > 8192 / 1
    assert torch.equal(scaled[high], plain[high])
    torch.testing.assert_close(scaled[low], plain[low] / 8)
    mid = ~high & ~low
    assert mid.any()
    assert bool(((scaled[mid] <= plain[mid]) & (scaled[mid] >= plain[mid] / 8)).all())


def test_rope_is_a_rotation_that_depends_on_relative_position() -> None:
    rope = RotaryEmbedding(16, 10000.0)
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)

    def score(pq: int, pk: int) -> float:
        cq, sq = rope.cos_sin(torch.tensor([pq]), torch.float64)
        ck, sk = rope.cos_sin(torch.tensor([pk]), torch.float64)
        return float((rope.apply(q.double(), cq, sq) * rope.apply(k.double(), ck, sk)).sum())

    # Angles are computed in fp32 (as Hugging Face does), hence the tolerance.
    assert score(5, 2) == pytest.approx(score(13, 10), rel=1e-5)
    c, s = rope.cos_sin(torch.tensor([7]), torch.float64)
    assert float(rope.apply(q.double(), c, s).norm()) == pytest.approx(float(q.double().norm()))
    with pytest.raises(ValueError, match="positions"):
        rope.cos_sin(torch.tensor([-1]), torch.float32)
