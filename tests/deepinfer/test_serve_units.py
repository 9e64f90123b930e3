"""Pieces of `deepinfer serve` without a server: stop strings (the engine's matcher, which the
replicas apply), parameter mapping, log-probability and choice formatting, the live replica view
under the `deepinfer_sched` routers, the step-time fit."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")

from deepinfer.engine.outputs import Logprob
from deepinfer.engine.stop_strings import StopStringMatcher
from deepinfer.serve.choices import Collected
from deepinfer.serve.errors import APIError
from deepinfer.serve.logprobs import FLOOR, chat_logprobs, completion_logprobs, to_wire
from deepinfer.serve.params import build_spec
from deepinfer.serve.protocol import ChatCompletionRequest, CompletionRequest
from deepinfer.serve.replica_view import ReplicaView
from deepinfer.serve.request_stream import Delta
from deepinfer.serve.routing import ReplicaRouter, RoutedRequest, prompt_hashes
from deepinfer.serve.step_model import StepTimeFit


# ---------------------------------------------------------------------- stop strings
# The server has no stop matcher of its own: stop strings travel in SamplingParams and the
# replica's engine cuts them (deepinfer.engine.stop_strings). These pin the streaming
# semantics the HTTP API promises on that matcher.
@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet="abc\n", max_size=40),
    stops=st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
@example(text="\naa", stops=["a", "\naa"], cuts=[2])  # a later-starting stop completes first
@example(text="\naa", stops=["a", "\naa"], cuts=[])  # one piece: the earliest start wins
def test_engine_stop_matcher_equals_cutting_the_whole_text(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    """However the text arrives in pieces, generation stops at the first piece that completes
    a stop string, and the released text is what came before that stop string's earliest
    occurrence (OpenAI semantics); nothing past it is ever released. (Which stop wins can
    depend on the pieces: with stops "a" and "\\naa", pieces "\\na" + "a" stop at "a" before
    "\\naa" exists, as an engine checking after each token does.)"""
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    expected, hit = text, None
    for b in bounds[1:]:
        found = [(i, s) for s in stops if (i := text[:b].find(s)) >= 0]
        if found:
            at = min(i for i, _ in found)
            expected, hit = text[:at], True
            break
    m = StopStringMatcher(stops)
    out, matched = "", None
    for a, b in itertools.pairwise(bounds):
        released, matched = m.push(text[a:b])
        out += released
        assert expected.startswith(out)
        if matched is not None:
            break
    if matched is None:
        out += m.flush()
    assert out == expected
    assert (matched is not None) == bool(hit)
    if matched is not None:
        assert expected + matched == text[: len(expected) + len(matched)]


def test_engine_stop_matcher_holds_back_a_partial_stop() -> None:
    m = StopStringMatcher(("END",))
    assert m.push("abcE") == ("abc", None)
    assert m.push("N") == ("", None)
    assert m.push("x") == ("ENx", None)
    assert m.push("yEND tail") == ("y", "END")
    assert m.push("more") == ("", "END")


# ---------------------------------------------------------------------- parameters
def test_parameters_map_onto_sampling_params() -> None:
    req = CompletionRequest(
        model="m",
        prompt="x",
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=0,
        seed=3,
        stop="##",
        user="alice",
        stream=True,
        stream_options={"include_usage": True},
    )
    spec = build_spec(req, default_max_tokens=16)
    p = spec.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed) == (7, 0.5, 0.9, -1, 3)
    assert p.stop == ("##",)  # the engine applies it
    assert spec.namespace == b"user:alice"
    assert spec.include_usage


def test_chat_max_completion_tokens_and_defaults() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    spec = build_spec(
        ChatCompletionRequest(model="m", messages=msgs, max_completion_tokens=5),
        default_max_tokens=100,
    )
    assert spec.params.max_tokens == 5
    assert (
        build_spec(
            ChatCompletionRequest(model="m", messages=msgs), default_max_tokens=99
        ).params.max_tokens
        == 99
    )
    with pytest.raises(APIError) as err:
        build_spec(
            ChatCompletionRequest(model="m", messages=msgs, max_tokens=3, max_completion_tokens=4),
            default_max_tokens=9,
        )
    assert err.value.status == 400 and err.value.param == "max_completion_tokens"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"best_of": 2, "stream": True}, "best_of"),
        ({"best_of": 2, "temperature": 0.0}, "best_of"),
        ({"logprobs": 21}, "logprobs"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stop": [""]}, "stop"),
        ({"suffix": "z"}, "suffix"),
    ],
)
def test_bad_parameters_raise_400_naming_them(fields: dict[str, object], param: str) -> None:
    with pytest.raises(APIError) as err:
        build_spec(CompletionRequest(model="m", prompt="x", **fields), default_max_tokens=4)  # type: ignore[arg-type]
    assert err.value.status == 400
    assert err.value.param == param
    assert err.value.body()["error"]["param"] == param


def test_n_logprobs_and_stop_reach_sampling_params() -> None:
    spec = build_spec(
        CompletionRequest(
            model="m", prompt="x", n=2, best_of=3, logprobs=4, seed=9, stop=["a", "bb"]
        ),
        default_max_tokens=4,
    )
    p = spec.params
    assert (p.n, p.best_of, p.logprobs, p.stop) == (2, 3, 4, ("a", "bb"))
    assert spec.candidates == 3
    msgs = [{"role": "user", "content": "hi"}]
    chat = build_spec(
        ChatCompletionRequest(model="m", messages=msgs, logprobs=True, top_logprobs=5, n=2),
        default_max_tokens=4,
    )
    assert (chat.params.logprobs, chat.params.n) == (5, 2)
    plain = build_spec(ChatCompletionRequest(model="m", messages=msgs), default_max_tokens=4)
    assert plain.params.logprobs is None
    assert (
        build_spec(
            ChatCompletionRequest(model="m", messages=msgs, logprobs=True), default_max_tokens=4
        ).params.logprobs
        == 0
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs=true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"n": 0}, "n"),
    ],
)
def test_bad_chat_logprob_parameters_name_them(fields: dict[str, object], param: str) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(APIError) as err:
        build_spec(ChatCompletionRequest(model="m", messages=msgs, **fields), default_max_tokens=4)  # type: ignore[arg-type]
    assert err.value.status == 400 and err.value.param == param


# ---------------------------------------------------------------------- logprobs, choices
def _position(chosen: int, table: dict[int, tuple[float, int]]) -> dict[int, Logprob]:
    out = {chosen: Logprob(table[chosen][0], table[chosen][1], f"t{chosen}")}
    for t, (lp, rank) in table.items():
        out.setdefault(t, Logprob(lp, rank, f"t{t}"))
    return out


def test_logprobs_wire_and_openai_shapes() -> None:
    # Token 7 sampled at rank 3; the top 2 are 1 and 2. -inf becomes the JSON-safe floor.
    pos = _position(7, {7: (-2.5, 3), 1: (-0.5, 1), 2: (-1.0, 2)})
    ruled_out = _position(4, {4: (-math.inf, 9)})
    wire = to_wire([pos, ruled_out])
    assert wire[0][0] == [7, -2.5, 3, "t7"] and wire[1][0][1] == FLOOR
    legacy, end = completion_logprobs(wire, 10)
    assert legacy["tokens"] == ["t7", "t4"]
    assert legacy["token_logprobs"] == [-2.5, FLOOR]
    assert legacy["top_logprobs"][0] == {"t7": -2.5, "t1": -0.5, "t2": -1.0}  # top k + chosen
    assert legacy["text_offset"] == [10, 12] and end == 14
    chat = chat_logprobs(wire[:1], 2)["content"]
    assert chat[0]["token"] == "t7" and chat[0]["bytes"] == list(b"t7")
    assert [e["token"] for e in chat[0]["top_logprobs"]] == ["t1", "t2"]  # exactly k, by rank
    assert chat_logprobs(wire[:1], 0)["content"][0]["top_logprobs"] == []


def test_best_of_keeps_the_most_likely_completions_renumbered() -> None:
    done = Collected()
    for i, (text, cum) in enumerate((("a", -3.0), ("b", -1.0), ("c", -2.0))):
        done.add(
            Delta(
                index=i,
                text=text,
                finished=True,
                finish_reason="length",
                cumulative_logprob=cum,
                last=i == 2,
            )
        )
    choices = done.completion_choices(2, with_logprobs=False)
    assert [(c["index"], c["text"]) for c in choices] == [(0, "b"), (1, "c")]
    assert all(c["finish_reason"] == "length" for c in choices)


def test_interleaved_completions_keep_their_own_text() -> None:
    done = Collected()
    for index, text in ((0, "x"), (1, "p"), (0, "y"), (1, "q")):
        done.add(Delta(index=index, text=text))
    done.add(Delta(index=1, finished=True, finish_reason="stop", stop_reason="##"))
    done.add(Delta(index=0, finished=True, finish_reason="length", last=True))
    choices = done.chat_choices(2, None)
    assert [c["message"]["content"] for c in choices] == ["xy", "pq"]
    assert [(c["finish_reason"], c["stop_reason"]) for c in choices] == [
        ("length", None),
        ("stop", "##"),
    ]


# ---------------------------------------------------------------------- routing
def _view(i: int, *, waiting: int = 0, held: tuple[int, ...] = ()) -> ReplicaView:
    v = ReplicaView(i)
    v.on_ready({"block_size": 4, "capacity_blocks": 64, "max_batched_tokens": 64})
    v.on_state(
        {
            "num_waiting": waiting,
            "waiting_tokens": 16 * waiting,
            "num_running": 0,
            "kv_used_tokens": 0,
            "free_blocks": 64,
            "step_overhead_s": 0.01,
            "step_s_per_token": 0.001,
            "stored": list(held),
            "evicted": [],
        }
    )
    return v


def test_prefix_events_steer_prefix_affinity_and_cost_routers() -> None:
    prompt = list(range(40))
    hashes = prompt_hashes(prompt, 4, b"")
    assert len(hashes) == 10
    req = RoutedRequest(1, len(prompt), 8, hashes, "")
    views = [_view(0), _view(1, held=hashes[:6]), _view(2, held=hashes[:2])]
    assert views[1].cached_prefix_blocks(hashes) == 6
    for name in ("prefix_affinity", "cost", "ttft_estimate"):
        router = ReplicaRouter(name, lambda: views)
        assert router.route(req, views) is views[1], name
    # An evict event takes the blocks away again; the chain breaks at the first missing block.
    views[1].on_state({**_state(), "evicted": [hashes[0]]})
    assert views[1].cached_prefix_blocks(hashes) == 0
    assert ReplicaRouter("prefix_affinity", lambda: views).route(req, views) is views[2]


def _state() -> dict[str, object]:
    return {
        "num_waiting": 0,
        "waiting_tokens": 0,
        "num_running": 0,
        "kv_used_tokens": 0,
        "free_blocks": 64,
        "step_overhead_s": 0.01,
        "step_s_per_token": 0.001,
    }


def test_a_routed_request_counts_at_once_and_its_blocks_until_reported() -> None:
    hashes = prompt_hashes(list(range(16)), 4, b"t")
    v = _view(0)
    v.on_routed("r1", hashes, 16)
    assert v.num_waiting == 1 and v.waiting_tokens == 16
    assert v.cached_prefix_blocks(hashes) == 4  # soon held: the next turn may follow it
    v.on_finished("r1")
    assert v.cached_prefix_blocks(hashes) == 4  # kept until the replica's next report
    v.on_state(_state())
    assert v.cached_prefix_blocks(hashes) == 0  # the report did not list them: not cached


def test_namespaces_never_share_block_hashes() -> None:
    tokens = list(range(32))
    assert not set(prompt_hashes(tokens, 8, b"user:a")) & set(prompt_hashes(tokens, 8, b"user:b"))


def test_ttft_admission_rejects_when_the_queue_is_too_long() -> None:
    busy = _view(0, waiting=50)  # 800 queued tokens at 1 ms each
    router = ReplicaRouter("least_loaded", lambda: [busy], ttft_slo_s=0.1)
    req = RoutedRequest(1, 16, 4, (), "")
    assert router.admit(req, busy, 0.0) == "predicted_ttft"
    idle = _view(1)
    assert router.admit(req, idle, 0.0) is None


def test_unknown_router_is_refused() -> None:
    with pytest.raises(ValueError, match="router must be one of"):
        ReplicaRouter("random", lambda: [])


# ---------------------------------------------------------------------- step-time fit
def test_step_fit_recovers_overhead_and_per_token_cost() -> None:
    fit = StepTimeFit()
    assert fit.coefficients() == fit.prior
    for tokens in (1, 8, 64, 256, 1, 32, 128, 4) * 5:
        fit.add(tokens, 0.004 + 0.0002 * tokens)
    a, b = fit.coefficients()
    assert a == pytest.approx(0.004, rel=1e-6) and b == pytest.approx(0.0002, rel=1e-6)
    same = StepTimeFit()
    for _ in range(5):
        same.add(10, 0.01)
    assert same.coefficients() == (0.0, pytest.approx(0.001))


def test_front_hashes_match_the_replica_store() -> None:
    """The router only sees a replica's prefix if the front hashes prompts exactly as that
    replica's store does (namespace and the store's model key folded in)."""
    import torch

    from deepinfer.serve.replica import block_key
    from deepinfer_cache import HostTier, TieredKVStore

    store = TieredKVStore([HostTier((2, 4), torch.float32, 1 << 20)], 4, model=b"model-key")
    with store.subscribe() as events:
        tokens = list(range(21))
        store.store(tokens, torch.ones(5, 2, 4), namespace=b"user:t")
        stored = [block_key(h) for e in events.poll() for h in e.hashes]
    assert stored == list(prompt_hashes(tokens, 4, b"user:t", b"model-key"))
    assert stored != list(prompt_hashes(tokens, 4, b"user:t"))
    store.close()


def test_speculative_counters_feed_the_accepted_length_histogram() -> None:
    """A finished request's DSpark counters (steps, accepted drafts) become one observation of
    tokens per step: 1 + accepted / steps."""
    from deepinfer.serve.config import ServeConfig
    from deepinfer.serve.service import ServeService

    service = ServeService(ServeConfig())
    tracked = type("T", (), {"prompt_ids": [1, 2, 3]})()
    service._account(tracked, {"spec": [4, 6]}, 10)  # type: ignore[arg-type]
    service._account(tracked, {"spec": [0, 0]}, 2)  # type: ignore[arg-type]
    text = service.metrics.render().decode()
    assert "deepinfer_spec_accepted_length_count 1.0" in text
    assert "deepinfer_spec_accepted_length_sum 2.5" in text
    assert "deepinfer_generation_tokens_total 12.0" in text


def test_a_report_sent_before_a_routed_request_arrived_keeps_it_queued() -> None:
    """A replica's ``state`` lists the requests it received since its last (``seen``); one
    routed here and not yet listed stays counted on top of the reported load, so a report
    the replica sent before the request reached it does not make it look idle."""
    v = _view(0)
    v.on_routed("r1", (), 16)
    v.on_state(_state())  # sent before r1 arrived: reports an idle replica
    assert (v.num_waiting, v.waiting_tokens) == (1, 16)
    v.on_routed("r2", (), 8)
    assert (v.num_waiting, v.waiting_tokens) == (2, 24)
    # r1 arrived and is running; r2 still in flight to the replica.
    v.on_state({**_state(), "num_running": 1, "seen": ["r1"]})
    assert (v.num_waiting, v.waiting_tokens, v.num_running) == (1, 8, 1)
    v.on_finished("r2")  # failed before the replica listed it: counted no longer
    v.on_state({**_state(), "num_running": 1})
    assert (v.num_waiting, v.waiting_tokens) == (0, 0)
    v.on_routed("r3", (), 4)
    v.on_ready({"block_size": 4, "capacity_blocks": 64})  # restarted: nothing in flight to it
    v.on_state(_state())
    assert v.num_waiting == 0
