"""`n`, `best_of` and log-probabilities over HTTP with the official `openai` client, against a
tiny random model: what the server returns equals `LLM.generate` with the same
`SamplingParams` (candidate ``i`` of a seeded request samples with ``seed + i`` in both), and
streaming returns the same choices as a whole response. Through ``--pd 1:1`` the first token's
log-probabilities come from the prefill replica.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from serve_helpers import thread_server, tiny_model

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.serve import ServeConfig

pytest.importorskip("fastapi")

MODEL = "tiny"
ENGINE = EngineConfig(block_size=8, num_blocks=96, max_model_len=256, max_num_seqs=16)
PROMPT = [(13 * j + 5) % 200 + 3 for j in range(11)]
LP_TOL = 1e-4  # the same float32 forward, batched the same way: logprobs agree closely


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("serve-choices-model"))


@pytest.fixture(scope="module")
def client(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    config = ServeConfig(
        model=str(gguf),
        served_model_name=MODEL,
        replicas=1,
        in_process=True,
        engine=ENGINE,
        prefix_cache=None,
        cache_dir=str(tmp_path_factory.mktemp("serve-choices-cache")),
    )
    with thread_server(config) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from deepinfer.llm import LLM

    llm = LLM(
        str(gguf),
        engine_config=ENGINE,
        enable_prefix_caching=False,
        cache_dir=tmp_path_factory.mktemp("serve-choices-offline"),
    )
    yield llm
    llm.close()


def _chosen(out: RequestOutput, i: int) -> list[float]:
    """Completion ``i``'s chosen-token log-probabilities (the first entry of each position)."""
    positions = out.outputs[i].logprobs
    assert positions is not None
    return [next(iter(p.values())).logprob for p in positions]


def test_n_with_logprobs_equals_llm_generate(client: openai.OpenAI, offline: Any) -> None:
    params = SamplingParams(
        n=3, temperature=0.9, seed=11, max_tokens=8, logprobs=2, ignore_eos=True
    )
    [ref] = offline.generate([PROMPT], params)
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        n=3,
        temperature=0.9,
        seed=11,
        max_tokens=8,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    choices = sorted(out.choices, key=lambda c: c.index)
    assert [c.index for c in choices] == [0, 1, 2]
    assert [c.text for c in choices] == [o.text for o in ref.outputs]
    assert len({c.text for c in choices}) > 1  # seeds seed+i: the completions differ
    for i, c in enumerate(choices):
        lp = c.logprobs
        assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
        assert lp.token_logprobs == pytest.approx(_chosen(ref, i), abs=LP_TOL)
        assert len(lp.token_logprobs) == 8 and c.finish_reason == "length"
        for top, chosen in zip(lp.top_logprobs, lp.token_logprobs):
            assert 1 <= len(top) <= 3  # top 2 plus the sampled token
            assert max(top.values()) >= chosen - 1e-6
        assert lp.text_offset is not None and lp.text_offset[0] == 0
        assert out.usage is not None and out.usage.completion_tokens == 24


def test_n_streaming_returns_the_same_choices(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "prompt": PROMPT,
        "n": 2,
        "temperature": 0.8,
        "seed": 3,
        "max_tokens": 7,
        "logprobs": 1,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**kw)
    text: dict[int, str] = defaultdict(str)
    logprobs: dict[int, list[float]] = defaultdict(list)
    finish: dict[int, str] = {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            text[c.index] += c.text
            if c.logprobs is not None and c.logprobs.token_logprobs is not None:
                logprobs[c.index] += c.logprobs.token_logprobs
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    for c in whole.choices:
        assert text[c.index] == c.text
        assert c.logprobs is not None
        assert logprobs[c.index] == pytest.approx(c.logprobs.token_logprobs, abs=LP_TOL)
        assert finish[c.index] == c.finish_reason == "length"


def test_best_of_returns_the_most_likely_candidate(client: openai.OpenAI, offline: Any) -> None:
    params = SamplingParams(n=1, best_of=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    [ref] = offline.generate([PROMPT], params)
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        n=1,
        best_of=3,
        temperature=1.0,
        seed=5,
        max_tokens=6,
        extra_body={"ignore_eos": True},
    )
    assert [c.text for c in out.choices] == [ref.outputs[0].text]
    assert out.choices[0].index == 0


def test_chat_logprobs_streaming_or_not(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "list three colours"}]
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and 1 <= len(content) <= 6
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        # Greedy from the raw distribution: the chosen token is the most likely one.
        assert entry.token == entry.top_logprobs[0].token
        assert entry.logprob == pytest.approx(tops[0])
        assert entry.bytes == list(entry.token.encode("utf-8"))
    # One entry per generated token (special tokens included, which the text skips).
    assert whole.usage is not None and len(content) == whole.usage.completion_tokens
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed += c.logprobs.content
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=LP_TOL)


def test_chat_n_streams_each_choice(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 5,
        "temperature": 0.7,
        "seed": 1,
        "n": 2,
    }
    whole = client.chat.completions.create(**kw)
    assert sorted(c.index for c in whole.choices) == [0, 1]
    text: dict[int, str] = defaultdict(str)
    roles: dict[int, str] = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.delta.role:
                roles[c.index] = c.delta.role
    assert roles == {0: "assistant", 1: "assistant"}
    assert {i: text[i] for i in (0, 1)} == {c.index: c.message.content for c in whole.choices}


def test_pd_forwards_the_first_tokens_logprobs(gguf: Path, offline: Any, tmp_path: Path) -> None:
    """Through ``--pd 1:1`` the first token is sampled on the prefill replica; its
    log-probabilities reach the client as the decode replica's later ones do. ``n > 1`` is a
    400 naming ``n`` there."""
    params = SamplingParams(temperature=0.0, max_tokens=5, logprobs=2, ignore_eos=True)
    [ref] = offline.generate([PROMPT], params)
    config = ServeConfig(
        model=str(gguf),
        served_model_name=MODEL,
        replicas=2,
        pd=(1, 1),
        in_process=True,
        engine=ENGINE,
        prefix_cache=PrefixCacheConfig(device_blocks=16, host_bytes=1 << 22, disk_bytes=0),
        cache_dir=str(tmp_path),
    )
    with thread_server(config) as url:
        pd = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        kw: dict[str, Any] = {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 5,
            "temperature": 0,
            "logprobs": 2,
            "extra_body": {"ignore_eos": True},
        }
        out = pd.completions.create(**kw)
        lp = out.choices[0].logprobs
        assert out.choices[0].text == ref.text
        assert lp is not None and lp.token_logprobs is not None
        assert lp.token_logprobs == pytest.approx(_chosen(ref, 0), abs=LP_TOL)
        assert lp.top_logprobs is not None and all(lp.top_logprobs)
        streamed: list[float] = []
        for chunk in pd.completions.create(stream=True, **kw):
            if chunk.choices and chunk.choices[0].logprobs is not None:
                streamed += chunk.choices[0].logprobs.token_logprobs or []
        assert streamed == pytest.approx(_chosen(ref, 0), abs=LP_TOL)
        with pytest.raises(openai.BadRequestError) as err:
            pd.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, n=2)
        assert isinstance(err.value.body, dict) and err.value.body.get("param") == "n"
