"""PD worker faults: a killed worker costs only its own requests; it is started again and the
mode keeps serving. Bounded: every wait has a deadline and the workers are stopped at the end."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer import EngineConfig, RequestOutput, SamplingParams
from deepinfer.llm import build_worker_engine
from deepinfer.models.convert import convert_gguf
from deepinfer.pd import PDConfig, PDCoordinator, PDWorkerError

pytestmark = pytest.mark.slow

ENGINE = EngineConfig(block_size=8, num_blocks=96, max_model_len=160)
PARAMS = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)


# No prefix cache (so no disk tier under $DEEPINFER_CACHE_DIR); the workers share the machine's
# compiled CPU kernels instead of compiling their own.


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    cfg = tiny_config(max_position_embeddings=512)
    root = tmp_path_factory.mktemp("pd-faults")
    path = write_tiny_gguf(root / "tiny.gguf", cfg, random_hf_state(cfg, seed=4))
    return str(convert_gguf(path, root / "models"))


def _prompts(n: int, offset: int = 0) -> list[list[int]]:
    vocab = tiny_config().vocab_size
    return [[(11 * (i + offset) + 5 * j + 3) % vocab for j in range(6 + i)] for i in range(n)]


def _drive(pd: PDCoordinator, rids: set[str], deadline_s: float) -> dict[str, RequestOutput]:
    done: dict[str, RequestOutput] = {}
    end = time.monotonic() + deadline_s
    while set(rids) - set(done):
        assert time.monotonic() < end, "PD requests did not finish in time"
        for out in pd.poll(0.2):
            if out.finished:
                done[out.request_id] = out
    return done


def _generate(
    pd: PDCoordinator, prompts: list[list[int]], params: list[SamplingParams]
) -> list[RequestOutput]:
    """Final outputs in prompt order, through the coordinator's client seam (submit, then
    ``run_until``, as ``LLM.generate`` drives it)."""
    order = [pd.submit(p, sp, b"") for p, sp in zip(prompts, params)]
    done = {rid: failed for rid, failed in order if failed is not None}
    for out in pd.run_until({rid for rid, _ in order} - set(done)):
        if out.finished:
            done[out.request_id] = out
    return [done[rid] for rid, _ in order]


def test_killed_workers_cost_only_their_own_requests(model_dir: str, tmp_path: Path) -> None:
    """One 1P:2D coordinator (worker start-up dominates the cost), in three phases: SIGKILL of
    a decode worker mid-decode, death of the prefill worker, a slot that cannot start again."""
    config = PDConfig(num_prefill_workers=1, num_decode_workers=2, request_timeout_s=60.0)
    with PDCoordinator(
        model_dir, engine_config=ENGINE, config=config, build=build_worker_engine
    ) as pd:
        _decode_worker_killed_mid_decode(pd)
        _prefill_worker_killed_before_any_output(pd)
        _decode_slots_that_cannot_start_retire_and_pd_stops(pd, model_dir, tmp_path)


def _decode_worker_killed_mid_decode(pd: PDCoordinator) -> None:
    prompts = _prompts(6)
    reference = _generate(pd, prompts, [PARAMS] * 6)
    assert all(o.error is None for o in reference)

    rids = [pd.submit(p, PARAMS)[0] for p in prompts]
    # Wait until both decode workers hold requests that have streamed, then kill one.
    end = time.monotonic() + 30
    seen: dict[str, RequestOutput] = {}
    while not all(w.view.in_flight for w in pd.decode):
        assert time.monotonic() < end
        for out in pd.poll(0.05):
            seen[out.request_id] = out
    victim, survivor = pd.decode
    on_victim = set(victim.view.in_flight)
    on_survivor = set(survivor.view.in_flight)
    old_pid = victim.process.pid
    os.kill(old_pid, signal.SIGKILL)

    done = _drive(pd, set(rids) - {r for r, o in seen.items() if o.finished}, 90)
    done.update({r: o for r, o in seen.items() if o.finished})
    by_rid = dict(zip(rids, reference))
    assert on_victim and on_survivor
    for rid in on_survivor:  # untouched: complete and identical to the undisturbed run
        assert done[rid].error is None
        assert done[rid].token_ids == by_rid[rid].token_ids
    for rid in on_victim:  # failed by name, or (had it not streamed) run again in full
        out = done[rid]
        if out.error is not None:
            assert "died" in out.error and out.finish_reason == "error"
        else:
            assert out.token_ids == by_rid[rid].token_ids
    assert any(done[rid].error for rid in on_victim)

    # The slot was started again and the mode keeps serving on both decode workers.
    assert pd.num_restarts == 1
    assert pd.decode[0].process.pid != old_pid
    # A hang guard, not a speed bound: a restart imports torch and loads the model (10 s at
    # load 3 on 2 cores, far more on a loaded runner); the coordinator itself kills a start
    # that runs past its start-up timeout.
    end = time.monotonic() + pd.config.startup_timeout_s + 60
    while not pd.decode[0].ready:
        assert time.monotonic() < end, "the restarted decode worker never became ready"
        pd.poll(0.2)
    rids = [pd.submit(p, PARAMS)[0] for p in prompts]
    again: dict[str, RequestOutput] = {}
    both = False
    end = time.monotonic() + 90
    while set(rids) - set(again):
        assert time.monotonic() < end, "PD requests did not finish in time"
        both = both or all(w.view.in_flight for w in pd.decode)
        again.update({o.request_id: o for o in pd.poll(0.05) if o.finished})
    assert both  # both slots took requests again
    assert [again[r].error for r in rids] == [None] * 6
    assert [again[r].token_ids for r in rids] == [o.token_ids for o in reference]


def _prefill_worker_killed_before_any_output(pd: PDCoordinator) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = _prompts(4, offset=3)
    reference = _generate(pd, prompts, [params] * 4)
    restarts = pd.num_restarts
    pd.prefill[0].process.kill()
    pd.prefill[0].process.join(10)
    # Submitted while the prefill worker is dead: nothing has streamed, so nothing fails (the
    # prompts are prefilled on a decode worker, or on the prefill worker once it is back).
    outs = _generate(pd, prompts, [params] * 4)
    assert [o.error for o in outs] == [None] * 4
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert pd.num_restarts == restarts + 1


def _decode_slots_that_cannot_start_retire_and_pd_stops(
    pd: PDCoordinator, model_dir: str, tmp_path: Path
) -> None:
    # A start-up timeout far above the bound below: the slots must be retired because their
    # starts die, not because a start timed out (a start imports torch first: tens of seconds
    # on a loaded 2-core runner, so the bound leaves room for that).
    pd.config = dataclasses.replace(pd.config, max_failed_starts=1, startup_timeout_s=900.0)
    for slot in pd.decode:  # their next start fails: the model directory is gone
        slot.settings_json = slot.settings_json.replace(model_dir, str(tmp_path / "gone"))
        slot.process.kill()
        slot.process.join(10)
    start = time.monotonic()
    with pytest.raises(PDWorkerError, match="no decode worker"):
        _generate(pd, [[1, 2, 3]], [SamplingParams(temperature=0, max_tokens=4)])
    assert time.monotonic() - start < 300
    assert all(slot.retired for slot in pd.decode)
    with pytest.raises(PDWorkerError, match="down"):
        _generate(pd, [[1, 2, 3]], [SamplingParams(temperature=0, max_tokens=4)])
