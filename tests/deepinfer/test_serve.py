"""`deepinfer serve` over HTTP with the official `openai` client: a tiny random model, two
replicas running as threads of the test process (the same messages as replica processes).

Covers chat and completions, streaming (SSE ending ``[DONE]``, ``include_usage``), stop strings,
usage and cached tokens, tenant isolation, errors in OpenAI's shape, greedy equality with
``LLM.generate``, 16 concurrent streams, a disconnect freeing its KV blocks, and a second turn
routed to the replica that holds its prefix.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from serve_helpers import health, thread_server, tiny_model, wait_for

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.serve import ServeConfig

pytest.importorskip("fastapi")

MODEL = "tiny"
ENGINE = EngineConfig(block_size=8, num_blocks=96, max_model_len=256, max_num_seqs=16)
SYSTEM = "You are a careful agent. Tools: search, read, write. Answer briefly. " * 2


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("serve-model"))


@pytest.fixture(scope="module")
def base(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cache = tmp_path_factory.mktemp("serve-cache")
    config = ServeConfig(
        model=str(gguf),
        served_model_name=MODEL,
        replicas=2,
        in_process=True,
        router="prefix_affinity",
        engine=ENGINE,
        prefix_cache=PrefixCacheConfig(device_blocks=24, host_bytes=1 << 22, disk_bytes=0),
        cache_dir=str(cache),
    )
    with thread_server(config) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def _greedy(client: openai.OpenAI, prompt: str | list[int], n: int = 12, **kw: object) -> str:
    out = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        extra_body={"ignore_eos": True},
        **kw,
    )
    return out.choices[0].text


# ---------------------------------------------------------------------- protocol
def test_models_and_health(base: str, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    body = health(base)
    assert body["status"] == "ok"
    assert [r["status"] for r in body["replicas"]] == ["up", "up"]


def test_chat_non_streaming_and_streaming_agree(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi there"}]
    full = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0
    )
    choice = full.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert full.usage is not None and full.usage.completion_tokens <= 10
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [choice.finish_reason]
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_sse_wire_format_ends_with_done(base: str) -> None:
    body = {"model": MODEL, "prompt": "the cat", "max_tokens": 4, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: ") :])
    assert last["object"] == "text_completion"
    assert last["choices"][0]["finish_reason"] in ("stop", "length")


def test_completion_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    expected = _greedy(client, "the theory of", 12)
    stream = client.completions.create(
        model=MODEL,
        prompt="the theory of",
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == expected


def test_stop_strings_cut_the_text_streaming_or_not(client: openai.OpenAI) -> None:
    prompt = "at the start there"
    text = _greedy(client, prompt, 16)
    assert len(text) >= 6
    stop = text[3:5]
    expected = text[: text.find(stop)]
    out = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert out.choices[0].text == expected
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].model_extra["stop_reason"] == stop  # the engine's, passed on
    # The replica's engine stopped at the hit (it did not run on to max_tokens).
    assert out.usage is not None and out.usage.completion_tokens < 16
    kept = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == expected + stop
    streamed = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        stop=stop,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_cached_tokens_reported_and_tenants_isolated(client: openai.OpenAI) -> None:
    prompt = SYSTEM + " question one"

    def cached(user: str) -> int:
        out = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=2, temperature=0, user=user
        )
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        return int(out.usage.prompt_tokens_details.cached_tokens or 0)

    assert cached("alice") == 0
    hit = cached("alice")
    assert hit > 0 and hit % ENGINE.block_size == 0
    assert cached("bob") == 0  # another tenant never hits alice's blocks


# ---------------------------------------------------------------------- errors
def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-nope", prompt="x", max_tokens=2)
    assert "gpt-nope" in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"n": 17}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"echo": True}, "echo"),
        ({"best_of": 3, "temperature": 0.0}, "best_of"),
        ({"best_of": 3, "stream": True}, "best_of"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(
    client: openai.OpenAI, kwargs: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=kwargs.pop("max_tokens", 2), **kwargs
        )  # type: ignore[arg-type]
    body = err.value.body
    assert isinstance(body, dict)
    assert body.get("param") == param or param in str(body.get("message")), body


def test_prompt_longer_than_context_and_bad_json_are_400(base: str) -> None:
    long = {"model": MODEL, "prompt": [5] * 300, "max_tokens": 2}
    r = httpx.post(f"{base}/v1/completions", json=long, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"
    assert "context window" in r.json()["error"]["message"]
    r = httpx.post(
        f"{base}/v1/chat/completions",
        content=b'{"model": "tiny", "messages": [',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{base}/v1/chat/completions", json={"model": MODEL}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


# ---------------------------------------------------------------------- engine equality
def test_greedy_http_equals_llm_generate(gguf: Path, client: openai.OpenAI, tmp_path: Path) -> None:
    from deepinfer.llm import LLM

    prompts = [
        [(11 * i + 3 * j + 4) % 200 + 3 for j in range(n)] for i, n in enumerate((5, 17, 40))
    ]
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    with LLM(
        str(gguf), engine_config=ENGINE, enable_prefix_caching=False, cache_dir=tmp_path
    ) as llm:
        offline = llm.generate(prompts, params)
    for prompt, ref in zip(prompts, offline):
        assert _greedy(client, prompt, 9) == ref.text


# ---------------------------------------------------------------------- load and disconnects
def test_sixteen_concurrent_streams(base: str, client: openai.OpenAI) -> None:
    prompts = [f"request number {i} says" for i in range(16)]
    expected = [_greedy(client, p, 8) for p in prompts[:4]]

    async def one(c: openai.AsyncOpenAI, prompt: str) -> tuple[str, str | None]:
        stream = await c.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        parts, finish = [], None
        async for chunk in stream:
            parts.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        return "".join(parts), finish

    async def all_of() -> list[tuple[str, str | None]]:
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as c:
            return await asyncio.wait_for(asyncio.gather(*(one(c, p) for p in prompts)), 120)

    results = asyncio.run(all_of())
    assert all(finish == "length" for _, finish in results)
    assert [text for text, _ in results[:4]] == expected
    routed = {r["index"]: r for r in health(base)["replicas"]}
    assert len(routed) == 2


def test_client_disconnect_aborts_and_frees_blocks(base: str) -> None:
    body = {
        "model": MODEL,
        "prompt": SYSTEM,
        "max_tokens": 200,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as r:
        replica = int(r.headers["x-deepinfer-replica"])
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one token arrived; now hang up

    def freed() -> bool:
        rep = health(base)["replicas"][replica]
        return rep["num_running"] == 0 and rep["free_blocks"] == rep["capacity_blocks"]

    wait_for(freed, 15.0, "the aborted request's KV blocks to be freed")
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert 'deepinfer_requests_total{outcome="aborted"}' in metrics


def test_second_turn_lands_on_the_replica_holding_its_prefix(base: str) -> None:
    def convo(tag: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": f"{tag}: {SYSTEM}"},
            {"role": "user", "content": f"{tag} asks for the plan"},
        ]

    def start(messages: list[dict[str, str]]) -> tuple[int, str, httpx.Response, httpx.Client]:
        c = httpx.Client(timeout=30)
        body = {"model": MODEL, "messages": messages, "max_tokens": 24, "stream": True}
        body["user"] = messages[0]["content"].split(":")[0]  # a tenant per conversation
        r = c.send(c.build_request("POST", f"{base}/v1/chat/completions", json=body), stream=True)
        return int(r.headers["x-deepinfer-replica"]), "", r, c

    def finish(r: httpx.Response, c: httpx.Client) -> str:
        text = []
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"]
                if choice:
                    text.append(choice[0]["delta"].get("content") or "")
        r.close()
        c.close()
        return "".join(text)

    # Two first turns in flight together (two tenants: no shared blocks, not even the chat
    # template's opening): the router spreads them over the two replicas by load.
    a1, _, ra, ca = start(convo("alpha"))
    b1, _, rb, cb = start(convo("beta"))
    answer_a, answer_b = finish(ra, ca), finish(rb, cb)
    assert a1 != b1
    for tag, first, answer in (("alpha", a1, answer_a), ("beta", b1, answer_b)):
        turn2 = [
            *convo(tag),
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "go on"},
        ]
        r = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": MODEL, "messages": turn2, "max_tokens": 2, "user": tag},
            timeout=30,
        )
        assert r.status_code == 200
        assert int(r.headers["x-deepinfer-replica"]) == first
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_admission_rejects_with_429_when_the_queue_is_full(gguf: Path, tmp_path: Path) -> None:
    config = ServeConfig(
        model=str(gguf),
        served_model_name=MODEL,
        replicas=1,
        in_process=True,
        engine=ENGINE,
        prefix_cache=None,
        cache_dir=str(tmp_path),
        max_waiting=1,
    )

    async def burst(url: str) -> list[httpx.Response]:
        body = {"model": MODEL, "prompt": SYSTEM, "max_tokens": 8, "ignore_eos": True}
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(
                *(c.post(f"{url}/v1/completions", json=body) for _ in range(8))
            )

    with thread_server(config) as url:
        responses = asyncio.run(burst(url))
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 429 in codes and set(codes) <= {200, 429}, codes
        rejected = next(r for r in responses if r.status_code == 429).json()["error"]
        assert rejected["type"] == "rate_limit_error"
        assert "queues" in rejected["message"]
        assert health(url)["in_flight"] == 0


def test_pd_one_prefill_one_decode_replica_matches_llm_generate(gguf: Path, tmp_path: Path) -> None:
    """``--pd 1:1``: every request prefills on replica 0, its KV pages move through shared
    memory to replica 1, which streams the rest; greedy text equals the offline engine's and
    no shared-memory segment is left behind."""
    import os

    from deepinfer.llm import LLM
    from deepinfer.pd.transport import segment_prefix

    def segments() -> set[str]:
        # In-process replicas export from this process; tests alongside export their own.
        shm, mine = "/dev/shm", segment_prefix()
        return {n for n in os.listdir(shm) if n.startswith(mine)} if os.path.isdir(shm) else set()

    before = segments()
    prompts = [[(7 * i + 5 * j + 3) % 200 + 3 for j in range(n)] for i, n in enumerate((3, 9, 33))]
    params = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    with LLM(
        str(gguf), engine_config=ENGINE, enable_prefix_caching=False, cache_dir=tmp_path
    ) as llm:
        offline = [o.text for o in llm.generate(prompts, params)]
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
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        assert [r["role"] for r in health(url)["replicas"]] == ["prefill", "decode"]
        for prompt, expected in zip(prompts, offline):
            assert _greedy(client, prompt, 7) == expected
            stream = client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=7,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            assert "".join(c.choices[0].text for c in stream) == expected
        r = httpx.post(
            f"{url}/v1/completions",
            json={
                "model": MODEL,
                "prompt": prompts[2],
                "max_tokens": 7,
                "temperature": 0,
                "ignore_eos": True,
            },
            timeout=30,
        )
        assert r.json()["choices"][0]["text"] == offline[2]
        assert r.headers["x-deepinfer-replica"] == "1"  # decoded on the decode replica
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'deepinfer_router_decisions_total{replica="0"} 7.0' in metrics
    assert segments() <= before
