"""PD pieces that run in one process: config validation, shared-memory page moves, and the
engine's prefilled-request entry point (prefill on one engine, decode on another)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import greedy_paged, random_hf_state, tiny_config

from deepinfer.engine import EngineConfig, LLMEngine, SamplingParams
from deepinfer.models import KVPool, LlamaModel, build_model
from deepinfer.pd import PDConfig
from deepinfer.pd.transport import (
    discard,
    export_pages,
    import_pages,
    segment_exists,
    segment_prefix,
)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    cfg = tiny_config(max_position_embeddings=512, tie_word_embeddings=False)
    return build_model(cfg, random_hf_state(cfg, seed=3))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_prefill_workers": 0},
        {"num_decode_workers": True},
        {"policy": "colocated"},
        {"router": "cost"},
        {"local_prefill_tokens": -1},
        {"worker_threads": 0},
        {"request_timeout_s": 0},
        {"startup_timeout_s": float("nan")},
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        PDConfig(**kwargs)  # type: ignore[arg-type]


def test_config_coerce() -> None:
    assert PDConfig.coerce(True) == PDConfig()
    assert PDConfig.coerce(False) is None
    cfg = PDConfig(policy="per_request")
    assert PDConfig.coerce(cfg) is cfg
    with pytest.raises(TypeError, match="pd"):
        PDConfig.coerce("yes")  # type: ignore[arg-type]


def test_params_round_trip_json() -> None:
    p = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_tokens=3, stop_token_ids=[4, 9])
    assert SamplingParams.from_json_dict(p.to_json_dict()) == p


@settings(max_examples=10)
@given(
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    picks=st.lists(st.integers(0, 11), min_size=1, max_size=6, unique=True),
    dst_seed=st.integers(0, 1000),
)
def test_pages_move_between_pools_and_segment_is_unlinked(
    dtype: torch.dtype, picks: list[int], dst_seed: int
) -> None:
    src = KVPool(2, 12, 4, 2, 8, dtype=dtype)
    src.tensor.copy_(torch.randn(src.tensor.shape).to(dtype))
    dst = KVPool(2, 12, 4, 2, 8, dtype=dtype)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(dst_seed))
    targets = order[: len(picks)].tolist()
    handle = export_pages(src, picks)
    assert segment_exists(handle["shm"])
    assert handle["shm"].startswith(segment_prefix()) and len(handle["shm"]) <= 30
    import_pages(dst, handle, targets)
    assert not segment_exists(handle["shm"])
    for s, d in zip(picks, targets):
        assert torch.equal(dst.tensor[:, :, d], src.tensor[:, :, s])
    untouched = sorted(set(range(12)) - set(targets))
    assert not dst.tensor[:, :, untouched].any()


def test_import_rejects_mismatched_pages_and_still_unlinks() -> None:
    src = KVPool(2, 4, 4, 2, 8)
    handle = export_pages(src, [0, 1])
    with pytest.raises(ValueError, match="shaped"):
        import_pages(KVPool(3, 4, 4, 2, 8), handle, [0, 1])
    assert not segment_exists(handle["shm"])
    handle = export_pages(src, [0])
    with pytest.raises(ValueError, match="dtype"):
        import_pages(KVPool(2, 4, 4, 2, 8, dtype=torch.float16), handle, [0])
    handle = export_pages(src, [2])
    assert discard(handle) is True
    assert discard(handle) is False


def _prefill_then_decode(model: LlamaModel, prompt: list[int], params: SamplingParams) -> list[int]:
    """What the two workers do, in one process: engine A prefills, engine B decodes."""
    cfg = EngineConfig(block_size=8, num_blocks=32)
    a, b = LLMEngine(model, None, cfg), LLMEngine(model, None, cfg)
    a.add_request(prompt, replace(params, max_tokens=2), request_id="r")
    (first,) = a.step()
    assert not first.finished and len(first.token_ids) == 1
    blocks = a.kv_block_ids("r")
    assert len(blocks) == -(-len(prompt) // 8)
    handle = export_pages(a.pool, blocks)
    a.abort("r")
    out = b.add_prefilled_request(
        prompt,
        first.token_ids[0],
        params,
        lambda ids: import_pages(b.pool, handle, ids),
        request_id="r",
    )
    while not out.finished:
        (out,) = b.step()
    assert b.pool.num_free_blocks == b.capacity_blocks
    assert a.pool.num_free_blocks == a.capacity_blocks
    return out.token_ids


@pytest.mark.parametrize("length", [1, 7, 8, 9, 23])
def test_prefilled_request_decodes_like_one_engine(model: LlamaModel, length: int) -> None:
    prompt = [(11 * j + 3) % model.config.vocab_size for j in range(length)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    assert _prefill_then_decode(model, prompt, params) == greedy_paged(model, prompt, 6)


def test_prefilled_request_stop_on_first_token_and_bad_input(model: LlamaModel) -> None:
    prompt = [5, 6, 7]
    first = greedy_paged(model, prompt, 1)[0]
    engine = LLMEngine(model, None, EngineConfig(block_size=8, num_blocks=8))
    params = SamplingParams(temperature=0.0, max_tokens=4, stop_token_ids=[first])
    out = engine.add_prefilled_request(prompt, first, params, lambda ids: None)
    assert out.finished and out.finish_reason == "stop" and out.token_ids == [first]
    assert engine.pool.num_free_blocks == engine.capacity_blocks
    with pytest.raises(ValueError, match="first_token"):
        engine.add_prefilled_request(prompt, -1, params, lambda ids: None)
    with pytest.raises(ValueError, match="empty"):
        engine.add_prefilled_request([], first, params, lambda ids: None)

    def broken(ids: list[int]) -> None:
        raise RuntimeError("transfer failed")

    with pytest.raises(RuntimeError, match="transfer failed"):
        engine.add_prefilled_request(prompt, first, params, broken, request_id="x")
    assert engine.pool.num_free_blocks == engine.capacity_blocks
    assert not engine.has_unfinished()


def test_views_fit_the_scheduler_protocols_and_drive_its_policies() -> None:
    from deepinfer.pd.routing import make_router
    from deepinfer.pd.views import PDRequestView, WorkerView
    from deepinfer_sched.policies import InstanceView, LeastLoadedPairing, RequestView

    a = WorkerView(0, 8, 64, "decode", {"r1": 40})
    b = WorkerView(1, 8, 64, "decode", {"r2": 10})
    req = PDRequestView(7, 30, 4)
    assert isinstance(a, InstanceView) and isinstance(req, RequestView)
    assert LeastLoadedPairing().pick(req, [a, b], 30) is b
    assert LeastLoadedPairing().pick(req, [a, b], 60) is None  # nobody has room
    idle = WorkerView(2, 8, 64, "prefill")
    assert make_router("least_loaded").route(req, [a, idle]) is idle  # fewer in flight
    assert make_router("least_loaded").route(req, [a, b]) is a  # tie: lower position
    rr = make_router("round_robin")
    assert [rr.route(req, [a, b]).instance_id for _ in range(4)] == [0, 1, 0, 1]
    assert make_router("power_of_two").route(req, [a, b]) in (a, b)


def test_prefill_cache_view_and_prefix_affinity_routing() -> None:
    """The coordinator's record of what each prefill worker cached: leading blocks only, LRU
    bounded; the default router follows it unless the holder is overloaded."""
    from deepinfer.pd.routing import make_router, prompt_block_hashes
    from deepinfer.pd.views import PDRequestView, WorkerView

    turn1 = prompt_block_hashes(list(range(40)), 8, b"chat")
    turn2 = prompt_block_hashes(list(range(40)) + [7] * 9, 8, b"chat")
    assert len(turn1) == 5 and turn2[:5] == turn1 and len(turn2) == 6
    assert prompt_block_hashes(list(range(40)), 8, b"other")[0] != turn1[0]  # namespaced
    assert prompt_block_hashes([-1] * 8, 8, b"") == ()  # rejected later by the worker

    a, b = WorkerView(0, 8, 64, "prefill"), WorkerView(1, 8, 64, "prefill")
    b.remember(turn1)
    assert a.cached_prefix_blocks(turn2) == 0 and b.cached_prefix_blocks(turn2) == 5
    assert b.cached_prefix_blocks((12345, *turn1)) == 0  # only a leading run counts
    req = PDRequestView(1, 49, 4, block_hashes=turn2)
    router = make_router("prefix_affinity")
    assert router.route(req, [a, b]) is b
    b.in_flight.update({f"r{i}": 8 for i in range(5)})  # far busier than a
    assert router.route(req, [a, b]) is a
    assert make_router("least_loaded").route(PDRequestView(2, 49, 4), [a, b]) is a

    small = WorkerView(2, 8, 64, "prefill", cache_view_blocks=3)
    small.remember(turn1)  # keeps the 3 most recent: blocks 2..4
    assert list(small.cached) == list(turn1[2:])
    assert small.cached_prefix_blocks(turn1) == 0
