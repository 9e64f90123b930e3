"""The vLLM-style sampling API end to end on a tiny random model: greedy unchanged, n / best_of,
logprobs and prompt_logprobs against a float64 reference, penalties, bias, min_tokens,
structured output, batched chat, bad parameters refused by name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from model_helpers import (
    dense_reference_logits,
    greedy_paged,
    random_hf_state,
    tiny_config,
    write_tiny_gguf,
)

from deepinfer import LLM, EngineConfig, SamplingParams
from deepinfer.engine import StructuredOutputsParams

CFG = tiny_config(max_position_embeddings=512)
STATE = random_hf_state(CFG, seed=3)
PROMPT = [5, 40, 77, 120, 9, 33, 250]


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", CFG, STATE)
    return LLM(str(path), enable_prefix_caching=False, engine_config=EngineConfig(num_blocks=96))


def test_greedy_is_unchanged_by_neutral_new_parameters(llm: LLM) -> None:
    want = greedy_paged(llm.loaded.model, PROMPT, 10)
    plain = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    neutral = SamplingParams(
        temperature=0.0,
        max_tokens=10,
        ignore_eos=True,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
        stop=["\x00never"],
        min_tokens=0,
        logprobs=3,
        logit_bias={},
    )
    outs = llm.generate([PROMPT, PROMPT], [plain, neutral])
    assert outs[0].token_ids == want
    assert outs[1].token_ids == want  # logprobs and an unmatched stop string change no token


def test_logprobs_match_the_float64_reference(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3)
    out = llm.generate([PROMPT], params)[0]
    comp = out.outputs[0]
    assert comp.logprobs is not None and len(comp.logprobs) == len(comp.token_ids)
    ids = PROMPT + comp.token_ids
    ref = torch.log_softmax(dense_reference_logits(CFG, STATE, ids), dim=-1)
    total = 0.0
    for k, (token, entry) in enumerate(zip(comp.token_ids, comp.logprobs)):
        row = ref[len(PROMPT) - 1 + k]
        assert next(iter(entry)) == token and entry[token].rank == 1  # greedy: the top token
        assert len(entry) == 3  # chosen (also the top one) + two more
        for t, lp in entry.items():
            assert lp.logprob == pytest.approx(float(row[t]), abs=1e-3)
        ranks = sorted(lp.rank for lp in entry.values())
        assert ranks == [1, 2, 3]
        total += float(row[token])
    assert comp.cumulative_logprob == pytest.approx(total, abs=1e-2)


def test_prompt_logprobs_match_the_reference(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    out = llm.generate([PROMPT], params)[0]
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(PROMPT)
    ref = torch.log_softmax(dense_reference_logits(CFG, STATE, PROMPT), dim=-1)
    for q in range(1, len(PROMPT)):
        entry = out.prompt_logprobs[q]
        assert entry is not None and next(iter(entry)) == PROMPT[q]
        assert entry[PROMPT[q]].logprob == pytest.approx(float(ref[q - 1, PROMPT[q]]), abs=1e-3)
        top = int(ref[q - 1].argmax())
        assert entry[top].rank == 1


def test_n_and_best_of(llm: LLM) -> None:
    # A high temperature: the tiny random model is too peaked for candidates to differ at 1.
    hot = {"temperature": 5.0, "ignore_eos": True}
    out = llm.generate([PROMPT], SamplingParams(n=3, max_tokens=6, seed=11, **hot))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # candidates differ
    again = llm.generate([PROMPT], SamplingParams(n=3, max_tokens=6, seed=11, **hot))
    assert [c.token_ids for c in again[0].outputs] == [c.token_ids for c in out.outputs]
    assert out.token_ids == out.outputs[0].token_ids and out.finished
    best = llm.generate([PROMPT], SamplingParams(n=2, best_of=5, max_tokens=4, seed=2, **hot))[0]
    scores = [c.cumulative_logprob for c in best.outputs]
    assert len(scores) == 2 and all(s is not None for s in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    assert all(c.logprobs is None for c in best.outputs)  # not asked for
    # The two kept are the best of all five candidates run with the same seeds.
    every = llm.generate([PROMPT], SamplingParams(n=5, max_tokens=4, seed=2, logprobs=0, **hot))[0]
    all_scores = sorted((c.cumulative_logprob or 0.0 for c in every.outputs), reverse=True)
    assert scores == pytest.approx(all_scores[:2])


def test_stream_with_n_ends_with_every_completion(llm: LLM) -> None:
    outs = list(llm.stream(PROMPT, SamplingParams(n=2, max_tokens=3, ignore_eos=True)))
    assert all(not o.finished for o in outs[:-1]) and outs[-1].finished
    assert [c.index for c in outs[-1].outputs] == [0, 1]
    assert {o.outputs[0].index for o in outs[:-1]} == {0, 1}


def test_penalties_change_greedy_decoding_as_the_reference_says(llm: LLM) -> None:
    params = SamplingParams(
        temperature=0.0,
        max_tokens=6,
        ignore_eos=True,
        repetition_penalty=3.0,
        frequency_penalty=1.5,
        presence_penalty=0.5,
    )
    got = llm.generate([PROMPT], params)[0].token_ids
    # Greedy decoding over the float64 reference with the same penalties, written out here.
    ids, out = list(PROMPT), []
    for _ in range(6):
        logits = dense_reference_logits(CFG, STATE, ids)[-1].float()
        for t in set(PROMPT) | set(out):
            logits[t] = logits[t] / 3.0 if logits[t] > 0 else logits[t] * 3.0
        for t in set(out):
            logits[t] -= 1.5 * out.count(t) + 0.5
        out.append(int(logits.argmax()))
        ids.append(out[-1])
    assert got == out
    assert got != greedy_paged(llm.loaded.model, PROMPT, 6)  # the penalties did something


def test_logit_bias_allowed_ids_and_min_tokens(llm: LLM) -> None:
    forced = llm.generate([PROMPT], SamplingParams(max_tokens=3, logit_bias={42: 100.0}))[0]
    assert forced.token_ids == [42, 42, 42]
    allowed = llm.generate(
        [PROMPT], SamplingParams(max_tokens=20, allowed_token_ids=[7, 8], ignore_eos=True)
    )[0]
    assert set(allowed.token_ids) <= {7, 8}
    eos = 2
    out = llm.generate(
        [PROMPT], SamplingParams(max_tokens=10, min_tokens=4, logit_bias={eos: 100.0})
    )[0]
    assert out.token_ids[:4] != [eos] * 4 and eos not in out.token_ids[:4]
    assert out.token_ids[4] == eos and out.finish_reason == "stop" and len(out.token_ids) == 5


def test_custom_logits_processor_sees_the_output_so_far(llm: LLM) -> None:
    seen: list[tuple[int, ...]] = []

    def count_up(output_ids: tuple[int, ...], logits: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(output_ids))
        logits[:] = float("-inf")
        logits[10 + len(output_ids)] = 0.0
        return logits

    params = SamplingParams(max_tokens=4, ignore_eos=True, logits_processors=[count_up])
    out = llm.generate([PROMPT], params)[0]
    assert out.token_ids == [10, 11, 12, 13]
    assert seen == [(), (10,), (10, 11), (10, 11, 12)]


@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        (StructuredOutputsParams(regex=r"(ab|cd){2,4}x"), r"(ab|cd){2,4}x"),
        (StructuredOutputsParams(choice=["yes", "no way"]), r"yes|no way"),
        (
            StructuredOutputsParams(grammar='start: "t" ("he" | "at") ("he" | "at")? "!"'),
            r"t(he|at){1,2}!",
        ),
        (StructuredOutputsParams(grammar='root ::= "a" [0-9] "b"'), r"a[0-9]b"),
    ],
)
def test_structured_output_text_matches(
    llm: LLM, constraint: StructuredOutputsParams, check: str
) -> None:
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=40, structured_outputs=constraint)
    outs = llm.generate([PROMPT, PROMPT[:3]], params)
    for out in outs:
        assert out.finish_reason == "stop", out.text
        assert re.fullmatch(check, out.text), out.text


def test_structured_output_json_schema(llm: LLM) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    params = SamplingParams(
        seed=1, max_tokens=60, structured_outputs=StructuredOutputsParams(json=schema)
    )
    out = llm.generate([PROMPT], params)[0]
    doc = json.loads(out.text)
    assert set(doc) == {"ok", "n"} and isinstance(doc["ok"], bool) and doc["n"] in (1, 2, 3)


def test_bad_constraint_fails_its_request_alone(llm: LLM) -> None:
    bad = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[a-"))
    good = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    outs = llm.generate([PROMPT, PROMPT], [bad, good])
    assert outs[0].error is not None and "structured_outputs.regex" in outs[0].error
    assert outs[1].error is None and len(outs[1].token_ids) == 2
    assert not llm.engine.has_unfinished()


def test_batched_chat(llm: LLM) -> None:
    convs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "the heat"}]]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    outs = llm.chat(convs, params)
    assert isinstance(outs, list) and len(outs) == 2
    singles = [llm.chat(c, params) for c in convs]
    assert [o.token_ids for o in outs] == [o.token_ids for o in singles]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n": 0}, "n"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"stop": [""]}, "stop"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"logits_processors": [1]}, "logits_processors"),
        ({"seed": "x"}, "seed"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
    ],
)
def test_bad_parameters_are_refused_by_name(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_structured_params_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="json"):
        StructuredOutputsParams(json="{not json")
    with pytest.raises(TypeError, match="choice"):
        StructuredOutputsParams(choice="abc")


def test_json_round_trip_for_process_boundaries() -> None:
    params = SamplingParams(
        stop=["a", "b"],
        logit_bias={3: 1.5},
        structured_outputs=StructuredOutputsParams(json={"type": "object"}),
        n=2,
    )
    raw = json.loads(json.dumps(params.to_json_dict()))
    assert SamplingParams.from_json_dict(raw) == params
    with pytest.raises(ValueError, match="logits_processors"):
        SamplingParams(logits_processors=[lambda ids, x: x]).to_json_dict()


def test_default_temperature_is_one_everywhere() -> None:
    from deepinfer.cli import build_parser

    args = build_parser().parse_args(["generate", "hi"])
    assert args.temperature == SamplingParams().temperature == 1.0


def test_bad_output_path_does_not_leave_requests_behind(tmp_path: Path, llm: LLM) -> None:
    # A processor that raises fails the call, and the engine is left with nothing queued.
    def boom(ids: tuple[int, ...], logits: torch.Tensor) -> torch.Tensor:
        return logits[:3]

    with pytest.raises(ValueError, match="logits_processors"):
        llm.generate([PROMPT], SamplingParams(max_tokens=2, logits_processors=[boom]))
    for rid in [s.request_id for s in list(llm.engine.running) + list(llm.engine.waiting)]:
        llm.engine.abort(rid)
    assert not llm.engine.has_unfinished()


def test_merge_ranks_best_of_and_refuses_unranked_candidates() -> None:
    from deepinfer.engine.fanout import fan_out, merge
    from deepinfer.engine.outputs import CompletionOutput, RequestOutput

    params = SamplingParams(n=2, best_of=3, seed=7)
    children = fan_out(params)
    assert [c.seed for c in children] == [7, 8, 9] and all(c.n == 1 for c in children)
    assert all(c.logprobs == 0 for c in children)  # ranking needs cumulative log-probs

    def out(i: int, score: float | None) -> RequestOutput:
        comp = CompletionOutput(0, f"t{i}", [i], cumulative_logprob=score, finish_reason="length")
        return RequestOutput(str(i), [1], [i], f"t{i}", finished=True, outputs=[comp])

    merged = merge(params, [out(0, -3.0), out(1, -1.0), out(2, -2.0)])
    assert [c.text for c in merged.outputs] == ["t1", "t2"] and merged.error is None
    assert [c.index for c in merged.outputs] == [0, 1] and merged.text == "t1"
    unranked = merge(params, [out(0, None), out(1, None), out(2, None)])
    assert unranked.error is not None and "best_of" in unranked.error
