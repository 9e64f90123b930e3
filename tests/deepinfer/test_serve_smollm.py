"""`deepinfer serve` on the embedded SmolLM2-135M-Instruct: greedy chat and completions over
HTTP equal offline `LLM` for the same prompts. One in-process replica, small ``max_tokens``."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from serve_helpers import thread_server

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.serve import ServeConfig

pytest.importorskip("fastapi")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE = EngineConfig(num_blocks=128, max_num_seqs=4)
MESSAGES = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one line."}, {"role": "user", "content": "2+2?"}],
]
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    config = ServeConfig(replicas=1, in_process=True, engine=ENGINE, prefix_cache=None)
    with thread_server(config, timeout=300) as url:
        yield url


def test_greedy_over_http_equals_offline_llm(base: str) -> None:
    from deepinfer.llm import LLM

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    model = client.models.list().data[0].id
    assert model == "SmolLM2-135M-Instruct"
    params = SamplingParams(temperature=0.0, max_tokens=10)
    with LLM(engine_config=ENGINE, enable_prefix_caching=False) as llm:
        chats = [llm.chat(m, params).text for m in MESSAGES]
        completion = llm.generate([PROMPT], params)[0].text
    for messages, expected in zip(MESSAGES, chats):
        out = client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=10,
            temperature=0,
        )
        assert out.choices[0].message.content == expected
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0)
    assert out.choices[0].text == completion
