"""deepinfer.engine.client: the EngineClient seam `LLM` drives (LocalClient, ClosedClient)."""

from __future__ import annotations

import inspect

import pytest
import torch
from model_helpers import tiny_config

from deepinfer.engine import EngineConfig, LLMEngine, SamplingParams
from deepinfer.engine.client import ClosedClient, EngineClient, LocalClient
from deepinfer.models import LlamaModel
from deepinfer.pd import PDCoordinator


def _engine() -> LLMEngine:
    torch.manual_seed(0)
    model = LlamaModel(tiny_config(max_position_embeddings=256)).eval()
    return LLMEngine(model, None, EngineConfig(num_blocks=32, max_num_seqs=4))


def test_run_until_yields_until_the_asked_requests_finish_and_others_run_alongside() -> None:
    engine = _engine()
    client = LocalClient(engine)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    other, _ = client.submit([7, 8, 9], SamplingParams(temperature=0.0, max_tokens=8))
    rid, refused = client.submit([1, 2, 3, 4], params)
    assert refused is None
    outs = list(client.run_until({rid}))
    mine = [o for o in outs if o.request_id == rid]
    assert [len(o.new_token_ids) for o in mine] == [1, 1, 1] and mine[-1].finished
    assert any(o.request_id == other for o in outs)  # the other request advanced too
    assert engine.has_unfinished()  # ...and is still queued: it was not asked for
    assert list(client.run_until({other}))[-1].finished
    assert not engine.has_unfinished()


def test_leaving_run_until_early_aborts_what_it_was_waiting_for() -> None:
    engine = _engine()
    client = LocalClient(engine)
    free = engine.pool.num_free_blocks
    rid, _ = client.submit([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=20))
    for out in client.run_until({rid}):
        assert not out.finished
        break
    assert not engine.has_unfinished() and engine.pool.num_free_blocks == free


def test_close_runs_the_release_once_and_a_closed_client_refuses() -> None:
    calls: list[int] = []
    client = LocalClient(_engine(), on_close=lambda: calls.append(1))
    client.close()
    client.close()
    assert calls == [1]
    closed = ClosedClient()
    with pytest.raises(RuntimeError, match="closed"):
        closed.submit([1], SamplingParams())
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(closed.run_until({"x"})))
    closed.close()  # closing twice is harmless


def test_both_modes_take_the_calls_the_protocol_names() -> None:
    """`LLM` calls either client the same way (positionally), so each method takes the
    protocol's parameters in its order, with its defaults."""
    for name in ("submit", "run_until", "close"):
        want = inspect.signature(getattr(EngineClient, name)).parameters
        for cls in (LocalClient, ClosedClient, PDCoordinator):
            got = inspect.signature(getattr(cls, name)).parameters
            assert [(p.kind, p.default) for p in got.values()] == [
                (p.kind, p.default) for p in want.values()
            ], (cls.__name__, name)
