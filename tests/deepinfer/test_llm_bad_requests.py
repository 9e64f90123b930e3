"""A bad request fails alone: an error output for it, the others run, nothing stays queued."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer.engine import SamplingParams
from deepinfer.llm import LLM

GREEDY = SamplingParams(temperature=0.0, max_tokens=3)


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    cfg = tiny_config(max_position_embeddings=512)
    root = tmp_path_factory.mktemp("bad-requests")
    path = write_tiny_gguf(root / "tiny.gguf", cfg, random_hf_state(cfg, seed=5))
    with LLM(str(path), cache_dir=root / "models", enable_prefix_caching=False) as llm:
        yield llm


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (None, "NoneType"),
        (b"the cat", "bytes"),
        (bytearray(b"ab"), "bytearray"),
        (3.5, "float"),
        (["a", "b"], "must be ints"),
        ([1, True], "must be ints"),
        ([10**9], "token ids"),
        ("", "empty"),
        ("cat \ud800 dog", "surrogate U+D800"),
        (["\udfff"], "must be ints"),
    ],
)
def test_a_bad_prompt_fails_alone(llm: LLM, bad: object, needle: str) -> None:
    good = llm.generate(["the cat"], GREEDY)[0]
    outs = llm.generate(["the cat", bad, "a hat"], GREEDY)  # type: ignore[list-item]
    assert [o.error is None for o in outs] == [True, False, True]
    assert outs[1].finished and outs[1].finish_reason == "error"
    assert needle in (outs[1].error or "")
    assert outs[0].token_ids == good.token_ids
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=3, allowed_token_ids=[5, 10**6]),
        SamplingParams(temperature=0.0, max_tokens=3, logit_bias={10**6: 5.0}),
    ],
)
def test_token_ids_past_the_vocabulary_in_params_fail_that_request(
    llm: LLM, params: SamplingParams
) -> None:
    """As vLLM: an id the model cannot produce is refused by name, not silently dropped."""
    outs = llm.generate(["the cat", "a hat"], [GREEDY, params])
    name = "allowed_token_ids" if params.allowed_token_ids else "logit_bias"
    assert outs[0].error is None
    assert name in (outs[1].error or "") and "vocabulary" in (outs[1].error or "")
    edge = llm.engine.model.config.vocab_size - 1  # the last id is still fine
    ok = llm.generate(
        "the cat", SamplingParams(temperature=0.0, max_tokens=2, logit_bias={edge: 1.0})
    )
    assert ok[0].error is None
    assert not llm.engine.has_unfinished()


def test_a_lone_token_id_list_is_one_prompt(llm: LLM) -> None:
    outs = llm.generate([5, 6, 7], GREEDY)
    assert len(outs) == 1 and outs[0].error is None and outs[0].prompt_token_ids == [5, 6, 7]


def test_bad_seed_is_refused_before_anything_is_queued(llm: LLM) -> None:
    with pytest.raises(ValueError, match="seed"):
        llm.generate(["the cat", "a hat"], [GREEDY, SamplingParams(seed="x")])  # type: ignore[arg-type]
    assert not llm.engine.has_unfinished()


def test_wrong_params_type_fails_that_request_only(llm: LLM) -> None:
    outs = llm.generate(["the cat", "a hat"], [GREEDY, {"temperature": 0}])  # type: ignore[list-item]
    assert outs[0].error is None and "SamplingParams" in (outs[1].error or "")


def test_an_engine_failure_leaves_nothing_queued_for_the_next_call(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = [o.token_ids for o in llm.generate(["the cat", "a hat"], GREEDY)]
    real_step = llm.engine.step
    calls = {"n": 0}

    def failing_step() -> list:  # type: ignore[type-arg]
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected engine failure")
        return real_step()

    monkeypatch.setattr(llm.engine, "step", failing_step)
    with pytest.raises(RuntimeError, match="injected"):
        llm.generate(["one two", "three four"], GREEDY)
    assert not llm.engine.has_unfinished()
    monkeypatch.setattr(llm.engine, "step", real_step)
    again = llm.generate(["the cat", "a hat"], GREEDY)
    assert [o.token_ids for o in again] == expected


def test_leaving_a_stream_early_frees_its_request(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    free = llm.engine.pool.num_free_blocks
    for out in llm.stream("the cat", params):
        assert out.error is None
        assert llm.engine.pool.num_free_blocks < free  # the request holds KV blocks now
        break
    assert not llm.engine.has_unfinished()
    assert llm.engine.pool.num_free_blocks == free
    failed = list(llm.stream(None, params))  # type: ignore[arg-type]
    assert len(failed) == 1 and "NoneType" in (failed[0].error or "")


def test_namespace_must_be_bytes_per_request(llm: LLM) -> None:
    outs = llm.generate(["the cat", "a hat"], GREEDY, namespace=[b"t1", "t2"])  # type: ignore[list-item]
    assert outs[0].error is None and "namespace" in (outs[1].error or "")
