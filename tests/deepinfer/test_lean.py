"""The lean CPU runtime (``deepinfer.lean``) against the engine on the same GGUF files: greedy
tokens identical, logits within 1e-4 of the engine's own (captured at each step), on random
GGUF files in several block formats and on the embedded model; its sampling, limits, stop
rules, file checks and memory behaviour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf
from quant_helpers import quant_config, write_quant_gguf

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.lean import LeanLLM, LeanSampling, Sampler
from deepinfer.lean import model_files as lean_model_files
from deepinfer.lean.kv_cache import KVCache
from deepinfer.lean.model_files import BLOCKS_FILE, check_converted
from deepinfer.lean.weights import UnsupportedModel, check_supported

PROMPTS = ["the cat", "a hat on the mat", "the"]
NEW = 10
CTX = 256

# GGUF roles -> GGML types: each file mixes block formats (K-quants need 256-wide rows).
FORMATS = {
    "q4_0-q8_0": ({"attn_q": "Q4_0", "attn_k": "Q4_0", "attn_v": "Q8_0", "attn_output": "Q4_0",
                   "ffn_gate": "Q8_0", "ffn_up": "Q8_0", "ffn_down": "Q4_0",
                   "token_embd": "Q8_0"}, {}),
    "k-quants-untied": ({"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K",
                         "attn_output": "Q4_K", "ffn_gate": "Q5_K", "ffn_up": "Q4_K",
                         "ffn_down": "Q6_K", "token_embd": "Q4_1", "output": "Q8_0"},
                        {"tie_word_embeddings": False}),
    "q4_1-f16-bf16": ({"attn_q": "Q4_1", "attn_k": "F16", "attn_v": "BF16",
                       "attn_output": "Q4_1", "ffn_gate": "Q4_1", "ffn_up": "BF16",
                       "ffn_down": "F16", "token_embd": "Q4_1"}, {}),
}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One converted-models directory for the module (both runtimes read it; the compiled
    kernels stay in the default cache, so nothing is compiled again)."""
    return tmp_path_factory.mktemp("lean-models")


def _gguf(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(f"lean-{name}")
    if name == "f32":
        cfg = tiny_config(max_position_embeddings=512)
        return write_tiny_gguf(folder / "m.gguf", cfg, random_hf_state(cfg, seed=3))
    types, overrides = FORMATS[name]
    cfg = quant_config(max_position_embeddings=512, **overrides)
    return write_quant_gguf(folder / "m.gguf", cfg, types, seed=11)


def _engine_run(llm: LLM, prompt: str) -> tuple[list[int], list[np.ndarray]]:
    """The engine's greedy tokens and the logits it sampled each from."""
    seen: list[np.ndarray] = []

    def capture(ids: tuple[int, ...], logits: torch.Tensor) -> torch.Tensor:
        seen.append(logits.detach().float().numpy().copy())
        return logits

    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True,
                            logits_processors=[capture])  # fmt: skip
    out = llm.generate([prompt], params)[0]
    return list(out.token_ids), seen


def _compare(path: Path | None, prompts: list[str], models: Path | None) -> None:
    engine = LLM(None if path is None else str(path), enable_prefix_caching=False,
                 engine_config=EngineConfig(max_model_len=CTX, num_blocks=-(-CTX // 16) + 2),
                 cache_dir=models)  # fmt: skip
    lean = LeanLLM(path, max_model_len=CTX, cache_dir=models)
    try:
        for prompt in prompts:
            want_ids, want_logits = _engine_run(engine, prompt)
            got = lean.generate([prompt], LeanSampling(temperature=0, max_tokens=NEW,
                                                       ignore_eos=True))[0]  # fmt: skip
            assert got.token_ids == want_ids, prompt
            assert got.text == engine.tokenizer.decode(want_ids)
            model = lean.model
            assert model is not None
            model.reset()
            logits = model.prefill(lean.encode(prompt))
            for step, (token, want) in enumerate(zip(want_ids, want_logits)):
                np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4,
                                           err_msg=f"{prompt!r} step {step}")  # fmt: skip
                logits = model.decode(token)
        # A conversation through the model's chat template, encoded as LLM.chat does.
        messages = [{"role": "user", "content": prompts[0]}]
        want = engine.chat(messages, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        got = lean.chat(messages, LeanSampling(temperature=0, max_tokens=6, ignore_eos=True))
        assert got.token_ids == list(want.token_ids) and got.text == want.text
    finally:
        engine.close()
        lean.close()


@pytest.mark.parametrize("name", [*FORMATS, "f32"])
def test_greedy_tokens_and_logits_equal_the_engines(
    name: str, models: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _compare(_gguf(name, tmp_path_factory), PROMPTS, models)


def test_the_embedded_model_matches_the_engine() -> None:
    """The embedded SmolLM2-135M Q4_1 in the default cache (what `deepinfer generate` runs)."""
    from deepinfer.models.registry import default_model_path

    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    _compare(None, ["def fibonacci(n):"], None)


def test_prefill_chunks_and_long_prompts_match_one_token_at_a_time(
    models: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A prompt past one prefill chunk (and tiles of 16 rows with a ragged end) gives the
    logits that feeding it one token at a time gives (decode tiles), to fp32 rounding."""
    from deepinfer.lean import model as lean_model

    lean = LeanLLM(_gguf("q4_0-q8_0", tmp_path_factory), max_model_len=CTX, cache_dir=models)
    model = lean.model
    assert model is not None
    ids = [int(i) for i in np.random.default_rng(0).integers(3, 60, size=45)]
    old = lean_model.PREFILL_CHUNK
    lean_model.PREFILL_CHUNK = 20  # three chunks, the last ragged
    try:
        chunked = model.prefill(ids, all_logits=True)
    finally:
        lean_model.PREFILL_CHUNK = old
    model.reset()
    stepped = [model.prefill(ids[:1])] + [model.decode(t) for t in ids[1:]]
    np.testing.assert_allclose(chunked, np.stack(stepped), rtol=0, atol=1e-4)
    assert model.length == len(ids)
    with pytest.raises(ValueError, match="context holds"):
        model.prefill([1] * (CTX - len(ids) + 1))


def test_requests_follow_the_engines_rules(
    models: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = _gguf("q4_0-q8_0", tmp_path_factory)
    with LeanLLM(path, max_model_len=16, cache_dir=models) as lean:
        empty = lean.generate([""], LeanSampling(temperature=0))[0]
        assert empty.error is not None and "empty" in empty.error and not empty.token_ids
        long = lean.generate(["the " * 20], LeanSampling(temperature=0))[0]
        assert long.error is not None and "context holds 16" in long.error
        # The context limit ends a request with "length" (prompt + output = max_model_len).
        out = lean.generate(["the cat"], LeanSampling(temperature=0, max_tokens=64,
                                                      ignore_eos=True))[0]  # fmt: skip
        assert out.finish_reason == "length"
        assert len(lean.encode("the cat")) + len(out.token_ids) == 16
        # Streaming releases the same text in pieces.
        pieces = [o.new_text for o in lean.stream("the cat", LeanSampling(
            temperature=0, max_tokens=5, ignore_eos=True))]  # fmt: skip
        again = lean.generate(["the cat"], LeanSampling(temperature=0, max_tokens=5,
                                                        ignore_eos=True))[0]  # fmt: skip
        assert "".join(pieces) == again.text and len(pieces) == 5
        # A stop string cuts the text where it starts.
        full = again.text
        if len(full.strip()) > 2:
            stop = full.strip()[1:3]
            cut = lean.generate(["the cat"], LeanSampling(temperature=0, max_tokens=5,
                                                          stop=(stop,), ignore_eos=True))[0]  # fmt: skip
            assert cut.finish_reason == "stop" and stop not in cut.text
            assert full.startswith(cut.text)


def test_min_tokens_bans_eos_and_eos_stops(
    models: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = _gguf("q4_0-q8_0", tmp_path_factory)
    with LeanLLM(path, max_model_len=CTX, cache_dir=models) as lean:
        model = lean.model
        assert model is not None
        first = int(np.argmax(model.prefill(lean.encode("the cat"))))
        lean.tokenizer.eos_token_ids = (first,)  # make the greedy first token the EOS
        stopped = lean.generate(["the cat"], LeanSampling(temperature=0, max_tokens=8))[0]
        assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
        held = lean.generate(["the cat"], LeanSampling(temperature=0, max_tokens=8,
                                                       min_tokens=3))[0]  # fmt: skip
        assert first not in held.token_ids[:3] and len(held.token_ids) >= 3


def test_sampling_is_seeded_and_honours_its_filters() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))

    def draw(params: LeanSampling, n: int = 400) -> list[int]:
        sampler = Sampler(params)
        return [sampler(logits) for _ in range(n)]

    seeded = LeanSampling(temperature=1.0, seed=7)
    a = Sampler(seeded)
    b = Sampler(seeded)
    assert [a(logits) for _ in range(50)] == [b(logits) for _ in range(50)]
    assert set(draw(LeanSampling(top_k=1, seed=1), 50)) == {0}
    assert set(draw(LeanSampling(top_k=2, seed=2))) == {0, 1}
    assert set(draw(LeanSampling(top_p=0.7, seed=3))) == {0, 1}  # 0.5 + 0.3 reaches 0.7
    assert set(draw(LeanSampling(min_p=0.5, seed=4))) == {0, 1}  # p >= 0.25
    assert Sampler(LeanSampling(temperature=0))(logits, banned=[0]) == 1
    counts = np.bincount(draw(LeanSampling(seed=5), 4000), minlength=4) / 4000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.04)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"temperature": -1.0}, "temperature"), ({"temperature": float("nan")}, "temperature"),
     ({"top_p": 0.0}, "top_p"), ({"top_k": 0}, "top_k"), ({"min_p": 2.0}, "min_p"),
     ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
     ({"seed": -1}, "seed"), ({"stop": ("",)}, "stop")],
)  # fmt: skip
def test_bad_sampling_is_refused_by_name(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        LeanSampling(**kwargs)  # type: ignore[arg-type]


def test_unsupported_models_are_named() -> None:
    with pytest.raises(UnsupportedModel, match="q/k norms"):
        check_supported(tiny_config(qk_norm=True))
    with pytest.raises(UnsupportedModel, match="sliding"):
        check_supported(tiny_config(layer_windows=(0, 8)))


def test_the_file_constants_are_the_engines() -> None:
    from deepinfer.models import convert, gguf_model

    assert lean_model_files.CONVERSION_FORMAT == convert.FORMAT_VERSION
    assert lean_model_files.MARKER == convert.MARKER
    assert lean_model_files.BLOCKS_FILE == gguf_model.BLOCKS_FILE
    assert lean_model_files.BLOCKS_FORMAT == gguf_model.BLOCKS_FORMAT


def test_a_damaged_blocks_file_is_a_miss_and_is_rebuilt(
    models: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = _gguf("q4_1-f16-bf16", tmp_path_factory)
    with LeanLLM(path, max_model_len=64, cache_dir=models) as lean:
        want = lean.generate(["the cat"], LeanSampling(temperature=0, max_tokens=4))[0].text
    files = lean_model_files.find_lean_files(path, models)
    assert files is not None
    blocks = files.directory / BLOCKS_FILE
    data = bytearray(blocks.read_bytes())
    data[8:16] = b"\xff" * 8  # garbage in the header
    blocks.write_bytes(bytes(data))
    assert check_converted(path, files.directory) is None
    with LeanLLM(path, max_model_len=64, cache_dir=models) as lean:  # rebuilt by the engine
        assert lean.generate(["the cat"], LeanSampling(temperature=0, max_tokens=4))[0].text == want
    assert check_converted(path, files.directory) is not None


def test_the_kv_cache_commits_only_what_is_written() -> None:
    if not Path("/proc/self/pagemap").exists():
        pytest.skip("reads /proc/self/pagemap (Linux)")
    cache = KVCache(num_layers=4, max_tokens=4096, num_kv_heads=2, head_dim=64)

    def resident() -> int:
        import struct

        addr, size = cache.data.ctypes.data, cache.data.nbytes
        first, last = addr // 4096, (addr + size - 1) // 4096
        with open("/proc/self/pagemap", "rb") as fh:
            fh.seek(first * 8)
            raw = fh.read((last - first + 1) * 8)
        return 4096 * sum(e >> 63 for e in struct.unpack(f"<{len(raw) // 8}Q", raw))

    assert resident() == 0
    for i in range(4):
        k, v = cache.layer(i)
        k[0, :3] = 1.0  # three positions of one block
        v[0, :3] = 1.0
    assert 0 < resident() <= 8 * 2 * 4096, resident()  # a page or two per layer and K/V
    assert cache.nbytes == 4 * 2 * 256 * 16 * 2 * 64 * 4
