"""`deepinfer serve --speculative <checkpoint>`: replicas that draft with a DSpark drafter
(a tiny one built for the tiny random model and saved with ``save_drafter``) answer greedy
requests exactly as the non-speculative server does, streaming or not, and drafts were
accepted (the ``deepinfer_spec_accepted_length`` histogram's mean is above one token/step).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest
import spec_helpers
from serve_helpers import thread_server, tiny_model

from deepinfer.engine.config import EngineConfig, SpeculativeConfig
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.serve import ServeConfig

pytest.importorskip("fastapi")

MODEL = "tiny"
ENGINE = EngineConfig(block_size=8, num_blocks=96, max_model_len=256, max_num_seqs=8)
PROMPTS = [[(9 * i + 7 * j + 2) % 200 + 3 for j in range(n)] for i, n in enumerate((6, 19, 35))]
MAX_TOKENS = 12


def _config(gguf: Path, cache: Path, speculative: SpeculativeConfig | None) -> ServeConfig:
    return ServeConfig(
        model=str(gguf),
        served_model_name=MODEL,
        replicas=1,
        in_process=True,
        engine=ENGINE,
        prefix_cache=None,
        cache_dir=str(cache),
        speculative=speculative,
    )


def _greedy(client: openai.OpenAI, prompt: list[int], stream: bool) -> str:
    kw = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    if stream:
        chunks = client.completions.create(stream=True, extra_body={"ignore_eos": True}, **kw)  # type: ignore[call-overload]
        return "".join(c.choices[0].text for c in chunks if c.choices)
    out = client.completions.create(extra_body={"ignore_eos": True}, **kw)  # type: ignore[call-overload]
    return str(out.choices[0].text)


def test_speculative_server_equals_the_plain_one(tmp_path: Path) -> None:
    from deepinfer.llm import LLM
    from deepinfer.models import load_model
    from deepinfer_spec.training import save_drafter

    gguf = tiny_model(tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(
        str(gguf), engine_config=ENGINE, enable_prefix_caching=False, cache_dir=tmp_path
    ) as llm:
        reference = [o.token_ids for o in llm.generate(PROMPTS, params)]
    # A drafter that often (not always) guesses the target's next token: some drafts are
    # accepted, some rejected, so both paths of the verifier run.
    loaded = load_model(str(gguf), cache_dir=tmp_path)
    ckpt = save_drafter(spec_helpers.oracle_drafter(loaded.model, reference), tmp_path / "drafter")
    # A fixed verify count and no gate: whether drafting pays on a loaded machine is not what
    # this test is about.
    spec = SpeculativeConfig(str(ckpt), num_speculative_tokens=3, draft_gate=False)

    with thread_server(_config(gguf, tmp_path, None)) as url:
        plain = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        expected = [_greedy(plain, p, stream=False) for p in PROMPTS]
    with thread_server(_config(gguf, tmp_path, spec)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        assert [_greedy(client, p, stream=False) for p in PROMPTS] == expected
        assert [_greedy(client, p, stream=True) for p in PROMPTS] == expected
        metrics = httpx.get(f"{url}/metrics", timeout=10).text

    def sample(name: str) -> float:
        found = re.search(rf"^deepinfer_spec_accepted_length_{name} (\S+)$", metrics, re.M)
        assert found is not None, name
        return float(found.group(1))

    count, total = sample("count"), sample("sum")
    assert count == 2 * len(PROMPTS)  # one observation per finished request
    assert total / count > 1.0  # more than one token per step: drafts were accepted


def test_serve_cli_builds_a_speculative_config() -> None:
    import argparse

    from deepinfer.serve.server import add_serve_parser, config_from_args

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", "--speculative", "/ckpt", "--num-speculative-tokens", "3", "--no-draft-gate"]
    )
    assert config_from_args(args).speculative == SpeculativeConfig("/ckpt", 3, draft_gate=False)
    plain = parser.parse_args(["serve", "--speculative", "dspark"])
    assert config_from_args(plain).speculative == "dspark"
    with pytest.raises(SystemExit, match="need --speculative"):
        config_from_args(parser.parse_args(["serve", "--num-speculative-tokens", "2"]))
    with pytest.raises(ValueError, match="speculative must be"):
        ServeConfig(speculative=3)  # type: ignore[arg-type]
