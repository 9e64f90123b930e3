"""LLMEngine / LLM on a tiny random model: batching, chunking, preemption, prefix cache, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import greedy_paged, random_hf_state, tiny_config, write_tiny_gguf

from deepinfer import LLM, EngineConfig, LLMEngine, SamplingParams
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.models import LlamaModel, build_model, load_model


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    cfg = tiny_config(max_position_embeddings=512)
    return build_model(cfg, random_hf_state(cfg, seed=3))


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config(max_position_embeddings=512)
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    return write_tiny_gguf(path, cfg, random_hf_state(cfg, seed=3))


def _run(engine: LLMEngine) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    assert not engine.has_unfinished()
    return done


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@settings(max_examples=8)
@given(
    lengths=st.lists(st.integers(1, 70), min_size=1, max_size=5),
    budget=st.sampled_from([4, 16, 64]),
    num_blocks=st.sampled_from([12, 64]),
)
def test_batched_greedy_equals_one_sequence_at_a_time(
    model: LlamaModel, lengths: list[int], budget: int, num_blocks: int
) -> None:
    # Chunked prefill under a small token budget and a pool small enough to force preemption
    # must not change a single greedy token.
    vocab = model.config.vocab_size
    prompts = [[(13 * i + 7 * j + 5) % vocab for j in range(n)] for i, n in enumerate(lengths)]
    engine = LLMEngine(
        model,
        None,
        EngineConfig(
            block_size=8, num_blocks=num_blocks, max_batched_tokens=budget, max_num_seqs=4
        ),
    )
    for i, p in enumerate(prompts):
        engine.add_request(p, GREEDY, request_id=str(i))
    done = _run(engine)
    for i, p in enumerate(prompts):
        assert done[str(i)] == greedy_paged(model, p, 8), f"prompt {i} (len {len(p)})"
    assert engine.pool.num_free_blocks == engine.capacity_blocks


def test_stop_rules(model: LlamaModel) -> None:
    prompt = [5, 6, 7, 8]
    free_run = greedy_paged(model, prompt, 6)
    engine = LLMEngine(model, None, EngineConfig(num_blocks=32))
    engine.add_request(
        prompt, SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[free_run[2]])
    )
    (tokens,) = _run(engine).values()
    assert tokens == free_run[: free_run.index(free_run[2]) + 1]


def test_seeded_sampling_is_reproducible(model: LlamaModel) -> None:
    params = SamplingParams(temperature=1.0, top_k=20, max_tokens=10, seed=7, ignore_eos=True)
    runs = []
    for _ in range(2):
        engine = LLMEngine(model, None, EngineConfig(num_blocks=32))
        engine.add_request([3, 4, 5], params)
        runs.append(next(iter(_run(engine).values())))
    assert runs[0] == runs[1]
    assert len(runs[0]) == 10


@pytest.mark.parametrize(
    ("prompt", "message"),
    [([], "empty"), ([1, 10**6], "token ids"), ([j % 200 for j in range(600)], "context")],
)
def test_bad_request_is_refused_with_a_clear_error(model: LlamaModel, prompt, message) -> None:
    engine = LLMEngine(model, None, EngineConfig(num_blocks=64))
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, GREEDY)
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"min_p": 2.0},
        {"temperature": float("nan")},
    ],
)
def test_bad_sampling_params_name_the_argument(kwargs: dict) -> None:
    (name,) = kwargs
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_a_sequence_that_outgrows_the_pool_ends_instead_of_hanging(model: LlamaModel) -> None:
    """The pool (10 blocks of 4) holds 40 tokens; a 39-token prompt asking for 8 more passes
    admission but runs out of blocks after two tokens with nothing left to preempt. It ends with
    ``"length"`` (a context limit), keeping its tokens, which equal the unconstrained run's
    first two; the other request is unaffected and every block returns to the pool."""
    big = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    small = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    prompt = [(7 * i + 1) % 200 for i in range(39)]
    roomy = LLMEngine(model, None, EngineConfig(block_size=4, num_blocks=64, max_model_len=64))
    roomy.add_request(prompt, big, request_id="big")
    expected = _run(roomy)["big"]
    engine = LLMEngine(model, None, EngineConfig(block_size=4, num_blocks=10, max_model_len=64))
    engine.add_request(prompt, big, request_id="big")
    engine.add_request([1, 2, 3], small, request_id="small")
    finished = {}
    for _ in range(100):
        finished.update({o.request_id: o for o in engine.step() if o.finished})
        if not engine.has_unfinished():
            break
    assert not engine.has_unfinished()
    out = finished["big"]
    assert out.finish_reason == out.outputs[0].finish_reason == "length"
    assert out.error is None and out.token_ids == expected[:2]
    assert len(finished["small"].token_ids) == 2
    assert engine.scheduler.pool.num_free_blocks == 10


def test_text_held_back_for_a_stop_string_is_released_when_the_pool_ends_a_request(
    gguf_path: Path, tmp_path: Path
) -> None:
    """Ending a request for outgrowing the pool releases the text a stop-string prefix held
    back (nothing the caller would have seen is lost)."""
    prompt = [(7 * i + 1) % 200 for i in range(39)]
    greedy = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    with LLM(
        str(gguf_path), engine_config=EngineConfig(max_model_len=64), cache_dir=tmp_path
    ) as llm:
        want = llm.generate([prompt], greedy)[0].text
    assert want
    # A stop string that the whole output so far is a proper prefix of: all of it is held.
    held = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, stop=[want + "\u2603"])
    small = EngineConfig(block_size=4, num_blocks=10, max_model_len=64)
    with LLM(
        str(gguf_path), engine_config=small, enable_prefix_caching=False, cache_dir=tmp_path
    ) as llm:
        out = llm.generate([prompt], held)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 2
    assert out.text == want


def test_one_bad_request_never_kills_the_batch(gguf_path: Path, tmp_path: Path) -> None:
    loaded = load_model(gguf_path, cache_dir=tmp_path / "models")
    llm = LLM(loaded, engine_config=EngineConfig(num_blocks=64), enable_prefix_caching=False)
    good = [5, 6, 7, 8, 9]
    outs = llm.generate([good, [], [1, 10**6], good], GREEDY)
    assert [o.error is None for o in outs] == [True, False, False, True]
    assert "empty" in (outs[1].error or "")
    assert outs[0].token_ids == outs[3].token_ids == greedy_paged(loaded.model, good, 8)


def test_stream_increments_add_up(gguf_path: Path, tmp_path: Path) -> None:
    loaded = load_model(gguf_path, cache_dir=tmp_path / "models")
    llm = LLM(loaded, engine_config=EngineConfig(num_blocks=64), enable_prefix_caching=False)
    pieces = list(llm.stream([5, 6, 7], GREEDY))
    assert pieces[-1].finished and not any(p.finished for p in pieces[:-1])
    assert [t for p in pieces for t in p.new_token_ids] == pieces[-1].token_ids
    assert "".join(p.new_text for p in pieces) == pieces[-1].text


def test_prefix_cache_hits_survive_restart_and_respect_tenants(
    gguf_path: Path, tmp_path: Path
) -> None:
    loaded = load_model(gguf_path, cache_dir=tmp_path / "models")
    cache = PrefixCacheConfig(device_blocks=8, host_bytes=1 << 20, directory=str(tmp_path / "kv"))
    cfg = EngineConfig(block_size=8, num_blocks=64)
    prompt = [(7 * j + 3) % loaded.config.vocab_size for j in range(45)]
    expected = greedy_paged(loaded.model, prompt, 8)

    with LLM(loaded, engine_config=cfg, prefix_cache_config=cache) as llm:
        cold = llm.generate([prompt], GREEDY, namespace=b"tenant-a")[0]
        warm = llm.generate([prompt], GREEDY, namespace=b"tenant-a")[0]
        other = llm.generate([prompt], GREEDY, namespace=b"tenant-b")[0]
    assert cold.metrics and warm.metrics and other.metrics
    assert cold.metrics.num_cached_tokens == 0
    assert warm.metrics.num_cached_tokens == 40  # every full block but the last token's
    assert other.metrics.num_cached_tokens == 0  # tenants never share blocks
    assert cold.token_ids == warm.token_ids == other.token_ids == expected

    with LLM(loaded, engine_config=cfg, prefix_cache_config=cache) as llm:
        restarted = llm.generate([prompt], GREEDY, namespace=b"tenant-a")[0]
    assert restarted.metrics and restarted.metrics.num_cached_tokens == 40
    assert restarted.token_ids == expected


def test_dense_and_engine_agree_in_bf16_within_argmax_ties(model: LlamaModel) -> None:
    # The engine runs in the model's dtype; bf16 weights must still decode sensibly.
    bf16 = build_model(model.config, model.hf_state_dict(), dtype=torch.bfloat16)
    engine = LLMEngine(bf16, None, EngineConfig(num_blocks=32))
    engine.add_request([5, 6, 7, 8], GREEDY)
    (tokens,) = _run(engine).values()
    assert len(tokens) == 8
    assert all(0 <= t < model.config.vocab_size for t in tokens)
