"""Pieces of `deepinfer serve` without a server: stop strings, parameter mapping, the live
replica view under the `deepinfer_sched` routers, the step-time fit."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")

from deepinfer.serve.errors import APIError
from deepinfer.serve.params import build_spec
from deepinfer.serve.protocol import ChatCompletionRequest, CompletionRequest
from deepinfer.serve.replica_view import ReplicaView
from deepinfer.serve.routing import ReplicaRouter, RoutedRequest, prompt_hashes
from deepinfer.serve.step_model import StepTimeFit
from deepinfer.serve.stop import StopMatcher


# ---------------------------------------------------------------------- stop strings
@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet="abc\n", max_size=40),
    stops=st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
@example(text="\naa", stops=["a", "\naa"], cuts=[2])  # a later-starting stop completes first
@example(text="\naa", stops=["a", "\naa"], cuts=[])  # one piece: the earliest start wins
def test_stop_matcher_equals_cutting_the_whole_text(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    """However the text arrives in pieces, generation stops at the first piece that completes
    a stop string, and the emitted text is what came before that stop string's earliest
    occurrence (OpenAI semantics); nothing past it is ever emitted. (Which stop wins can depend
    on the pieces: with stops "a" and "\\naa", pieces "\\na" + "a" stop at "a" before "\\naa"
    exists, as an engine checking after each token does.)"""
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    expected, hit = text, False
    for b in bounds[1:]:
        found = [i for i in (text[:b].find(s) for s in stops) if i >= 0]
        if found:
            expected, hit = text[: min(found)], True
            break
    m = StopMatcher(tuple(stops))
    out = ""
    for a, b in itertools.pairwise(bounds):
        out += m.feed(text[a:b])
        assert expected.startswith(out)
    out += m.flush()
    assert out == expected
    assert m.stopped == hit


def test_stop_matcher_holds_back_a_partial_stop() -> None:
    m = StopMatcher(("END",))
    assert m.feed("abcE") == "abc"
    assert m.feed("N") == ""
    assert m.feed("x") == "ENx"
    assert m.feed("yEND tail") == "y" and m.stopped
    assert m.feed("more") == "" and m.flush() == ""


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
    assert spec.stop == ("##",)
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
        ({"n": 3}, "n"),
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
