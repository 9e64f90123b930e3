"""HF directory (config.json + safetensors) round trip and errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_helpers import random_hf_state, tiny_config

from deepinfer.models import load_hf_dir, load_model, save_hf_dir


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    cfg = tiny_config(tie_word_embeddings=False)
    state = random_hf_state(cfg, seed=6)
    save_hf_dir(tmp_path, cfg, state, dtype=torch.float32)
    cfg2, state2 = load_hf_dir(tmp_path)
    assert cfg2 == cfg
    assert set(state2) == set(state)
    for name, tensor in state.items():
        assert torch.equal(state2[name], tensor)


def test_tied_checkpoint_drops_lm_head_and_loads(tmp_path: Path) -> None:
    cfg = tiny_config()
    state = random_hf_state(cfg, seed=7)
    save_hf_dir(tmp_path, cfg, {**state, "lm_head.weight": state["model.embed_tokens.weight"]})
    _, loaded = load_hf_dir(tmp_path)
    assert "lm_head.weight" not in loaded
    assert loaded["model.norm.weight"].dtype == torch.bfloat16


def test_model_dir_needs_tokenizer_and_weights(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"config\.json"):
        load_hf_dir(tmp_path)
    cfg = tiny_config()
    save_hf_dir(tmp_path, cfg, random_hf_state(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="safetensors"):
        load_hf_dir(tmp_path)
    with pytest.raises(ValueError):
        load_model(tmp_path)


def test_shards_may_not_repeat_a_tensor(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    cfg = tiny_config()
    save_hf_dir(tmp_path, cfg, random_hf_state(cfg))
    save_file({"model.norm.weight": torch.ones(32)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(ValueError, match="more than one shard"):
        load_hf_dir(tmp_path)
