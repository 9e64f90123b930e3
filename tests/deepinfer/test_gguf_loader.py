"""GGUF loading: llama.cpp names, the Q/K rotary permutation, dequantisation, cached conversion."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import (
    CHAT_TEMPLATE,
    dense_reference_logits,
    random_hf_state,
    tiny_config,
    write_tiny_gguf,
)

from deepinfer.models import LlamaConfig, load_gguf, load_model
from deepinfer.models.convert import MARKER, cache_root, convert_gguf
from deepinfer.models.gguf_loader import hf_name, permute_rotary, unpermute_rotary


@settings(max_examples=20)
@given(heads=st.integers(1, 4), half=st.integers(1, 4), cols=st.integers(1, 3))
def test_unpermute_inverts_permute(heads: int, half: int, cols: int) -> None:
    w = torch.randn(heads * 2 * half, cols)
    assert torch.equal(unpermute_rotary(permute_rotary(w, heads), heads), w)


def test_permute_interleaves_halves_within_each_head() -> None:
    # One head, head_dim 4: HF rows (0, 1 | 2, 3) pair 0 with 2 and 1 with 3; llama.cpp makes
    # pairs adjacent, giving row order 0, 2, 1, 3.
    w = torch.arange(8.0).reshape(8, 1)
    out = permute_rotary(w, 2).flatten().tolist()
    assert out == [0, 2, 1, 3, 4, 6, 5, 7]


def test_tensor_names_map_to_hf() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("blk.11.attn_k.bias") == "model.layers.11.self_attn.k_proj.bias"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("rope_freqs.weight") is None


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory):
    cfg = tiny_config()
    state = random_hf_state(cfg, seed=3)
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", cfg, state)
    return cfg, state, path


def test_gguf_config_and_weights_round_trip(tiny_gguf) -> None:
    cfg, state, path = tiny_gguf
    loaded_cfg, loaded, _ = load_gguf(path)
    assert loaded_cfg == cfg
    assert set(loaded) == set(state)
    for name, tensor in state.items():
        # Exact: F32 storage, and the un-permutation must restore HF's row order.
        assert torch.equal(loaded[name], tensor), name


def test_quantised_embedding_is_dequantised(tmp_path: Path) -> None:
    cfg = tiny_config()
    state = random_hf_state(cfg, seed=4)
    path = write_tiny_gguf(tmp_path / "q8.gguf", cfg, state, quantize_embedding=True)
    _, loaded, reader = load_gguf(path)
    assert any(t.tensor_type.name == "Q8_0" for t in reader.tensors)
    emb, ref = loaded["model.embed_tokens.weight"], state["model.embed_tokens.weight"]
    assert emb.dtype == torch.float32 and emb.shape == ref.shape
    assert not torch.equal(emb, ref)  # really went through quantisation
    # Q8_0: 32-value blocks with one scale each, 127 levels.
    assert (emb - ref).abs().max() <= ref.abs().max() / 127 + 1e-6


def test_loaded_gguf_model_computes_reference_logits(tiny_gguf, tmp_path: Path) -> None:
    cfg, state, path = tiny_gguf
    loaded = load_model(path, cache_dir=tmp_path)
    ids = [7, 70, 140, 21, 3]
    with torch.inference_mode():
        hidden, _ = loaded.model.forward_dense(torch.tensor([ids]))
    # The file's own (F32) weights, never rounded (#24): the fp64 reference to fp32 rounding.
    ref = dense_reference_logits(cfg, state, ids)
    torch.testing.assert_close(
        loaded.model.compute_logits(hidden)[0].double(), ref, atol=1e-4, rtol=1e-4
    )
    assert loaded.chat_template.source == CHAT_TEMPLATE
    assert loaded.tokenizer.eos_token_ids == (2,)


def test_block_cache_beside_the_bf16_copy(tiny_gguf, tmp_path: Path) -> None:
    """fp32 loads keep the file's tensors next to the converted copy; a bf16 load of the same
    file still reads only the copy, and a corrupt block cache is rebuilt, never served."""
    from deepinfer.models.gguf_model import BLOCKS_FILE

    _cfg, state, path = tiny_gguf
    first = load_model(path, cache_dir=tmp_path)
    directory = first.path
    assert (directory / BLOCKS_FILE).is_file()
    bf16 = load_model(path, cache_dir=tmp_path, dtype=torch.bfloat16)
    assert bf16.model.norm.weight.dtype == torch.bfloat16
    (directory / BLOCKS_FILE).write_bytes(b"garbage")
    again = load_model(path, cache_dir=tmp_path)
    assert torch.equal(again.model.embed_tokens.weight, state["model.embed_tokens.weight"])


def test_conversion_is_cached_and_redone_when_source_changes(tiny_gguf, tmp_path: Path) -> None:
    cfg, _state, path = tiny_gguf
    first = convert_gguf(path, tmp_path)
    marker = first / MARKER
    stamp = marker.stat().st_mtime_ns
    assert convert_gguf(path, tmp_path) == first
    assert marker.stat().st_mtime_ns == stamp  # not rewritten
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (first / name).is_file()
    assert json.loads((first / "config.json").read_text())["num_hidden_layers"] == cfg.num_layers
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.suffix != ".lock"]
    assert not leftovers  # no temporary directories left behind

    # Touching the file without changing it keeps the conversion: the source is identified
    # by content, so the same file installed elsewhere shares it too.
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert convert_gguf(path, tmp_path) == first
    assert marker.stat().st_mtime_ns == stamp
    copy = tmp_path / "elsewhere" / path.name
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    assert convert_gguf(copy, tmp_path) == first
    assert marker.stat().st_mtime_ns == stamp

    # New content under the same name is converted again.
    changed = random_hf_state(cfg, seed=11)
    write_tiny_gguf(copy, cfg, changed)
    again = convert_gguf(copy, tmp_path)
    assert again == first
    recorded = json.loads(marker.read_text())
    assert recorded["source_size"] == copy.stat().st_size
    assert recorded["source_sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()
    reloaded = load_model(copy, cache_dir=tmp_path)
    lm_head = reloaded.model.embed_tokens.weight
    assert torch.equal(lm_head, changed["model.embed_tokens.weight"])  # new, exact weights


def test_concurrent_conversions_convert_once(tiny_gguf, tmp_path: Path) -> None:
    """Processes loading the same model at once take turns: one converts, the rest reuse it."""
    _, _, path = tiny_gguf
    # Each conversion is logged and held open for a second, so that without the lock the three
    # processes (started together) would all be converting at the same time.
    log = tmp_path / "conversions.log"
    code = (
        "import os, sys, time\n"
        "import deepinfer.models.convert as c\n"
        "real = c._convert_into\n"
        "def logged(*args):\n"
        "    with open(sys.argv[3], 'a') as fh:\n"
        "        fh.write(f'{os.getpid()}\\n')\n"
        "    time.sleep(1.0)\n"
        "    real(*args)\n"
        "c._convert_into = logged\n"
        "print(c.convert_gguf(sys.argv[1], sys.argv[2]))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(tmp_path / "models"), str(log)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    root = tmp_path / "models"
    assert len(log.read_text().split()) == 1  # converted once
    assert {out.strip() for out, _ in outs} == {str(root / "tiny")}
    marker = root / "tiny" / MARKER
    stamp = marker.stat().st_mtime_ns
    assert convert_gguf(path, root) == root / "tiny"
    assert marker.stat().st_mtime_ns == stamp
    assert not [p for p in root.iterdir() if p.name.startswith(".") and p.suffix != ".lock"]


def test_incomplete_conversion_is_not_trusted(tiny_gguf, tmp_path: Path) -> None:
    _, _, path = tiny_gguf
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "config.json").write_text("{}")  # a crash before the marker was written
    out = convert_gguf(path, tmp_path)
    assert (out / MARKER).is_file()
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32


def test_cache_root_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path / "models"
    assert cache_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("DEEPINFER_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "deepinfer" / "models"


def test_bad_files_raise_value_error(tmp_path: Path) -> None:
    garbage = tmp_path / "bad.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="GGUF"):
        load_gguf(garbage)
    with pytest.raises(ValueError, match="not a file"):
        load_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match=r"\.gguf file or a model directory"):
        load_model(tmp_path / "missing.bin")


def test_config_from_gguf_metadata_reads_architecture(tiny_gguf) -> None:
    import gguf

    _, _, path = tiny_gguf
    cfg = LlamaConfig.from_gguf_metadata(gguf.GGUFReader(str(path)))
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 8)
    assert cfg.tie_word_embeddings and cfg.bos_token_id == 1
