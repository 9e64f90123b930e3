"""Logits processing under DSpark speculative decoding: every verify position is processed with
the drafts before it, so greedy requests with penalties, bias, bans or processors emit exactly
what plain decoding emits, and log-probabilities agree."""

from __future__ import annotations

import pytest
import spec_helpers
import torch
from model_helpers import random_hf_state, tiny_config

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.outputs import RequestOutput
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.models import LlamaModel, build_model
from deepinfer.speculative import DSparkSpeculator
from deepinfer_spec import FixedGammaScheduler

CFG = EngineConfig(block_size=4, num_blocks=256, max_num_seqs=8, max_batched_tokens=24)
PROMPTS = [[5, 9, 33, 120], [7, 7, 8, 200, 3, 14, 15]]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    cfg = tiny_config(max_position_embeddings=512)
    return build_model(cfg, random_hf_state(cfg, seed=11))


def _run(engine: LLMEngine, params: SamplingParams) -> list[RequestOutput]:
    for i, p in enumerate(PROMPTS):
        engine.add_request(p, params, request_id=str(i))
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[str(i)] for i in range(len(PROMPTS))]


def _no_sevens(output_ids: tuple[int, ...], logits: torch.Tensor) -> torch.Tensor:
    logits[7 + len(output_ids) % 3] = float("-inf")
    return logits


@pytest.mark.parametrize(
    "extra",
    [
        {"repetition_penalty": 2.0, "frequency_penalty": 0.8, "presence_penalty": 0.3},
        {"logit_bias": {11: 3.0, 12: -5.0}, "min_tokens": 6},
        {"logits_processors": [_no_sevens], "logprobs": 2},
    ],
)
def test_processed_greedy_spec_equals_processed_plain(model: LlamaModel, extra: dict) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=10, **extra)
    plain = _run(LLMEngine(model, None, CFG), params)
    expected = [o.token_ids for o in plain]
    # The oracle drafter learned the processed outputs, so many drafts are right and the
    # verify blocks run through processing at every position.
    drafter = spec_helpers.oracle_drafter(model, expected, 0, window=8)
    spec = DSparkSpeculator(drafter, FixedGammaScheduler(3), max_seqs=CFG.max_num_seqs)
    outs = _run(LLMEngine(model, None, CFG, speculator=spec), params)
    assert [o.token_ids for o in outs] == expected
    assert spec.stats.num_accepted > 0
    if params.logprobs is not None:
        for a, b in zip(outs, plain):
            la, lb = a.outputs[0].logprobs, b.outputs[0].logprobs
            assert la is not None and lb is not None and len(la) == len(a.token_ids)
            for ea, eb in zip(la, lb):
                assert ea.keys() == eb.keys()
                for t in ea:
                    assert ea[t].logprob == pytest.approx(eb[t].logprob, abs=1e-4)


class _Collecting(DSparkSpeculator):
    """Keeps every draft it sent to verification."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.drafted: list[int] = []

    def propose(self, batch):  # type: ignore[no-untyped-def]
        drafts = super().propose(batch)
        self.drafted.extend(t for row in drafts.tokens for t in row)
        return drafts


def test_hard_constraints_mask_the_drafter_too(model: LlamaModel) -> None:
    allowed = [3, 11, 12, 40, 41, 99]
    params = SamplingParams(temperature=0.0, max_tokens=10, allowed_token_ids=allowed)
    expected = [o.token_ids for o in _run(LLMEngine(model, None, CFG), params)]
    # An oracle for unconstrained greedy decoding mostly proposes forbidden tokens; the mask on
    # the drafter keeps every draft inside the allowed set.
    free = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    unconstrained = [o.token_ids for o in _run(LLMEngine(model, None, CFG), free)]
    drafter = spec_helpers.oracle_drafter(model, unconstrained + expected, 0, window=8)
    spec = _Collecting(drafter, FixedGammaScheduler(3), max_seqs=CFG.max_num_seqs)
    outs = _run(LLMEngine(model, None, CFG, speculator=spec), params)
    assert [o.token_ids for o in outs] == expected
    assert spec.drafted and set(spec.drafted) <= set(allowed)
