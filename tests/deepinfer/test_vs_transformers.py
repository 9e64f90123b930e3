"""Same weights in deepinfer and Hugging Face transformers give the same logits and greedy tokens.

transformers is a benchmark-only dependency (the ``bench`` extra); these tests skip without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_helpers import greedy_paged, one_thread, random_hf_state, tiny_config

from deepinfer.models import LlamaConfig, LoadedModel, build_model, default_model_path, load_model
from deepinfer.models.safetensors_loader import save_hf_dir

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.integration

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


def _hf_model(model_dir: Path) -> torch.nn.Module:
    model = transformers.LlamaForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True
    )
    return model.eval()


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_word_embeddings": False, "attention_bias": True},
        {
            "head_dim": 16,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ],
    ids=["tied", "untied-bias", "llama3-rope"],
)
def test_tiny_random_model_logits_match(tmp_path: Path, overrides: dict[str, object]) -> None:
    cfg: LlamaConfig = tiny_config(**overrides)
    state = random_hf_state(cfg, seed=11)
    save_hf_dir(tmp_path, cfg, state, dtype=torch.float32)
    ours = build_model(cfg, state)
    theirs = _hf_model(tmp_path)
    ids = torch.tensor([[1, 9, 77, 150, 3, 3, 260, 42, 18, 99, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]])
    with torch.inference_mode():
        ref = theirs(ids).logits[0].float()
        dense = ours.compute_logits(ours.forward_dense(ids)[0])[0]
    torch.testing.assert_close(dense, ref, atol=1e-4, rtol=1e-4)
    # And through the paged path, token by token after a prefill.
    greedy_ours = greedy_paged(ours, ids[0].tolist(), 8)
    with torch.inference_mode():
        out = theirs.generate(
            ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert greedy_ours == out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def smol() -> LoadedModel:
    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return load_model(dtype=torch.float32)


PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "Give me three tips for better sleep."}],
]


@pytest.mark.slow
def test_real_model_greedy_20_tokens_identical(smol: LoadedModel) -> None:
    # The engine runs the GGUF file's own Q4_1 weights (#24): transformers loads the same file
    # (dequantised by the gguf package), not the converted bf16 copy.
    path = default_model_path()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    for i, messages in enumerate(PROMPTS):
        ids = smol.tokenizer.encode(smol.chat_template.render(messages))
        if i == 0:  # and the logits over the prompt, within 1e-4
            with torch.inference_mode():
                dense = smol.model.compute_logits(smol.model.forward_dense(torch.tensor([ids]))[0])
                ref = theirs(torch.tensor([ids])).logits.float()
            torch.testing.assert_close(dense, ref, atol=1e-4, rtol=0)
        ours = greedy_paged(smol.model, ids, 20)
        with torch.inference_mode():
            out = theirs.generate(
                torch.tensor([ids]),
                max_new_tokens=20,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert ours == out[0, len(ids) :].tolist(), messages[0]["content"]


@pytest.mark.slow
def test_gguf_tokenizer_matches_transformers_gguf_conversion(smol: LoadedModel) -> None:
    """transformers converts GGUF tokenizers with its own code: both must agree."""
    path = default_model_path()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    texts = [
        "Hello world! 12345 tokens.",
        "def f(x):\n\treturn x**2  # ünïcode ✓",
        "<|im_start|>user\nHi there<|im_end|>\n",
    ]
    for text in texts:
        assert smol.tokenizer.encode(text) == hf_tok.encode(text, add_special_tokens=False), text
