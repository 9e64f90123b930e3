"""PD mode end to end: prefill and decode worker processes on a tiny random GGUF model.

Greedy output must equal the colocated engine's token for token, on the transfer path and on the
per-request local-prefill path; bad requests fail alone; no shared-memory segment outlives a
request; a dead worker is started again, not a hang.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import spec_helpers
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer import LLM, EngineConfig, RequestOutput, SamplingParams, SpeculativeConfig
from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.llm import build_worker_engine
from deepinfer.pd import PDConfig, PDCoordinator, PDWorkerError
from deepinfer.pd.transport import segment_prefix
from deepinfer_sched.policies import PerRequestPD

pytestmark = pytest.mark.slow

ENGINE = EngineConfig(block_size=8, num_blocks=64, max_model_len=128)
LENGTHS = [1, 7, 8, 9, 30, 61]


def _shm_names(pids: list[int]) -> set[str]:
    """KV segments exported by ``pids`` (tests running alongside export their own)."""
    prefixes = tuple(segment_prefix(p) for p in pids)
    return (
        {n for n in os.listdir("/dev/shm") if n.startswith(prefixes)}
        if os.path.isdir("/dev/shm")
        else set()
    )


@pytest.fixture(scope="module", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Prefill workers keep a prefix cache whose disk tier defaults to a directory under
    ``$DEEPINFER_CACHE_DIR``; keep it out of the user's cache (workers inherit the env)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEEPINFER_CACHE_DIR", str(tmp_path_factory.mktemp("deepinfer-cache")))
        yield


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config(max_position_embeddings=512, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("pd") / "tiny.gguf"
    return write_tiny_gguf(path, cfg, random_hf_state(cfg, seed=3))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    vocab = tiny_config().vocab_size
    return [[(13 * i + 7 * j + 5) % vocab for j in range(n)] for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=1 + (3 * i) % 9, ignore_eos=True)
        for i in range(len(LENGTHS))
    ]


@pytest.fixture(scope="module")
def colocated(
    gguf_path: Path, prompts: list[list[int]], params: list[SamplingParams], tmp_path_factory
) -> list[RequestOutput]:
    cache = tmp_path_factory.mktemp("cache")
    with LLM(
        str(gguf_path), engine_config=ENGINE, enable_prefix_caching=False, cache_dir=cache
    ) as llm:
        return llm.generate(prompts, params)


@pytest.fixture(scope="module")
def pd_llm(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    cache = tmp_path_factory.mktemp("cache")
    with LLM(str(gguf_path), engine_config=ENGINE, cache_dir=cache, pd=True) as llm:
        yield llm
    assert llm.pd is not None
    assert all(not p.process.is_alive() for p in llm.pd.workers)


class RecordingPolicy:
    """Per-request PD that remembers each decision (a `PDPolicy`)."""

    def __init__(self, local_prefill_tokens: int) -> None:
        self.inner = PerRequestPD(local_prefill_tokens)
        self.decisions: list[tuple[int, bool]] = []

    @property
    def disaggregated(self) -> bool:
        return True

    def prefill_on_decode(self, uncached_tokens: int) -> bool:
        local = self.inner.prefill_on_decode(uncached_tokens)
        self.decisions.append((uncached_tokens, local))
        return local


def test_greedy_identical_to_colocated_and_no_shm_left(
    pd_llm: LLM, prompts: list[list[int]], params: list[SamplingParams], colocated
) -> None:
    assert pd_llm.pd is not None
    pids = [w.process.pid for w in pd_llm.pd.workers]
    before = _shm_names(pids)
    outs = pd_llm.generate(prompts, params)
    for i, (got, want) in enumerate(zip(outs, colocated)):
        assert got.error is None, got.error
        assert got.token_ids == want.token_ids, f"prompt {i} (len {len(prompts[i])})"
        assert got.text == want.text
        assert got.finish_reason == want.finish_reason == "length"
        assert got.metrics is not None and got.metrics.ttft is not None
    assert pd_llm.pd is not None and not pd_llm.pd._requests
    pids += [w.process.pid for w in pd_llm.pd.workers]  # a worker started again: its too
    assert _shm_names(pids) - before == set()


def test_per_request_policy_prefills_short_prompts_on_decode(
    pd_llm: LLM, prompts: list[list[int]], params: list[SamplingParams], colocated
) -> None:
    assert pd_llm.pd is not None
    policy = RecordingPolicy(local_prefill_tokens=8)
    saved, pd_llm.pd.pd_policy = pd_llm.pd.pd_policy, policy
    try:
        outs = pd_llm.generate(prompts, params)
    finally:
        pd_llm.pd.pd_policy = saved
    assert [o.token_ids for o in outs] == [o.token_ids for o in colocated]
    assert sorted(policy.decisions) == sorted((n, n <= 8) for n in LENGTHS)


def test_bad_requests_fail_alone(
    pd_llm: LLM, prompts: list[list[int]], params: list[SamplingParams], colocated
) -> None:
    vocab = tiny_config().vocab_size
    batch = [prompts[3], [], [1, vocab + 5], list(range(1, 200)), prompts[4]]
    outs = pd_llm.generate(batch, [params[3], params[0], params[0], params[0], params[4]])
    assert outs[0].token_ids == colocated[3].token_ids and outs[0].error is None
    assert outs[4].token_ids == colocated[4].token_ids and outs[4].error is None
    assert "empty" in (outs[1].error or "")
    assert "out of range" in (outs[2].error or "") or "[0," in (outs[2].error or "")
    assert "context" in (outs[3].error or "")
    assert all(o.finish_reason == "error" for o in outs[1:4])


def test_stream_yields_first_token_from_prefill_then_increments(
    pd_llm: LLM, prompts: list[list[int]], colocated
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    steps = list(pd_llm.stream(prompts[4], params))
    assert steps[0].new_token_ids == steps[0].token_ids and len(steps[0].token_ids) == 1
    assert steps[-1].finished and not any(s.finished for s in steps[:-1])
    joined = [t for s in steps for t in s.new_token_ids]
    want = colocated[4].token_ids  # a greedy prefix: that run stopped after fewer tokens
    assert joined == steps[-1].token_ids and len(joined) == 6
    assert joined[: len(want)] == want
    assert "".join(s.new_text for s in steps) == steps[-1].text


def test_stop_token_at_first_position_needs_no_transfer(
    pd_llm: LLM, prompts: list[list[int]], colocated
) -> None:
    first = colocated[2].token_ids[0]
    params = SamplingParams(temperature=0.0, max_tokens=5, stop_token_ids=[first])
    (out,) = pd_llm.generate([prompts[2]], params)
    assert out.token_ids == [first] and out.finish_reason == "stop"


def test_decode_worker_stop_reason_reaches_the_caller_and_logprobs_are_refused(
    pd_llm: LLM, prompts: list[list[int]], colocated
) -> None:
    want = colocated[5].token_ids
    stop = next(t for i, t in enumerate(want) if i >= 2 and t not in want[:i])
    params = SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop])
    (out,) = pd_llm.generate([prompts[5]], params)
    assert out.token_ids == want[: want.index(stop) + 1]
    assert out.finish_reason == out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop  # vLLM's: the stop token id
    for name in ("logprobs", "prompt_logprobs"):
        ask = SamplingParams(temperature=0.0, max_tokens=3, **{name: 1})
        (refused,) = pd_llm.generate([prompts[5]], ask)
        assert refused.finish_reason == "error" and (refused.error or "").startswith(name)


def test_dead_worker_is_started_again_instead_of_hanging(gguf_path: Path, tmp_path: Path) -> None:
    """The only decode worker is dead when the request comes: it waits for the restarted one
    (tests/deepinfer/test_pd_faults.py covers requests caught by a death)."""
    model_dir = _model_dir(gguf_path, tmp_path)
    pd = PDCoordinator(
        model_dir,
        engine_config=ENGINE,
        config=PDConfig(request_timeout_s=30.0),
        build=build_worker_engine,
    )
    try:
        pd.decode[0].process.kill()
        pd.decode[0].process.join(10)
        start = time.monotonic()
        rid, failed = pd.submit([1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
        assert failed is None
        (out,) = [o for o in pd.run_until({rid}) if o.finished]
        assert out.error is None and len(out.token_ids) == 4
        assert pd.num_restarts == 1
        assert time.monotonic() - start < 120.0
    finally:
        pd.close()
    assert not pd.prefill[0].process.is_alive()


def test_worker_that_cannot_load_reports_fatal(tmp_path: Path) -> None:
    with pytest.raises(PDWorkerError, match="failed to start"):
        PDCoordinator(
            str(tmp_path / "missing"),
            config=PDConfig(startup_timeout_s=60.0),
            build=build_worker_engine,
        )


def _model_dir(gguf_path: Path, cache: Path) -> str:
    from deepinfer.models.convert import convert_gguf

    return str(convert_gguf(gguf_path, cache))


def test_the_calling_process_holds_no_weights(pd_llm: LLM) -> None:
    from deepinfer.models.loader import LoadedModel, ModelFiles

    assert isinstance(pd_llm.loaded, ModelFiles) and not isinstance(pd_llm.loaded, LoadedModel)
    assert not hasattr(pd_llm.loaded, "model") and not hasattr(pd_llm, "engine")
    assert pd_llm.tokenizer.encode("the cat")  # it still tokenizes and renders chats


def test_stream_of_a_bad_prompt_yields_one_error(pd_llm: LLM) -> None:
    (out,) = list(pd_llm.stream([], SamplingParams(temperature=0, max_tokens=3)))
    assert out.finished and out.finish_reason == "error" and "empty" in (out.error or "")


def test_pd_argument_is_checked_before_any_worker_starts(gguf_path: Path, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="pd must be"):
        LLM(str(gguf_path), engine_config=ENGINE, cache_dir=tmp_path, pd="yes")
    with pytest.raises(ValueError, match="speculative"):
        LLM(str(gguf_path), engine_config=ENGINE, cache_dir=tmp_path, pd=True, speculative="x")


def test_prefill_worker_prefix_cache_hits_the_next_turn_and_survives_a_restart(
    gguf_path: Path, tmp_path: Path
) -> None:
    """A prefill worker stores each prompt's full blocks when it hands the request off: the
    next turn of the conversation loads them (memory tiers, then the worker's own disk
    directory after a restart), and the output stays the colocated engine's."""
    vocab = tiny_config().vocab_size
    turn1 = [(11 * j + 3) % vocab for j in range(30)]  # 3 full blocks of 8
    turn2 = turn1 + [(5 * j + 1) % vocab for j in range(12)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with LLM(
        str(gguf_path), engine_config=ENGINE, enable_prefix_caching=False, cache_dir=tmp_path
    ) as ref:
        want = [o.token_ids for o in ref.generate([turn1, turn2], params)]
    kv_dir = tmp_path / "kv"
    cache = PrefixCacheConfig(
        device_blocks=8, host_bytes=1 << 20, disk_bytes=1 << 22, directory=str(kv_dir)
    )
    with _pd(gguf_path, tmp_path, prefix_cache_config=cache) as llm:
        first = llm.generate([turn1], params)[0]
        second = llm.generate([turn2], params)[0]
    assert [first.token_ids, second.token_ids] == want
    assert first.metrics is not None and first.metrics.num_cached_tokens == 0
    assert second.metrics is not None and second.metrics.num_cached_tokens == 24
    worker_dir = tmp_path / "kv-pd-prefill-0"
    assert any((worker_dir / "segments").glob("*.seg")), "the prefill worker persisted no blocks"

    disk_only = PrefixCacheConfig(
        device_blocks=0, host_bytes=0, disk_bytes=1 << 22, directory=str(kv_dir)
    )
    with _pd(gguf_path, tmp_path, prefix_cache_config=disk_only) as restarted:
        again = restarted.generate([turn2], params)[0]
    assert again.token_ids == want[1]
    # Turn 2 itself was stored at its hand-off: all 5 of its full blocks come from disk.
    assert again.metrics is not None and again.metrics.num_cached_tokens == 40


def test_pd_without_prefix_caching_starts_workers_without_a_cache(
    pd_llm: LLM, gguf_path: Path, tmp_path: Path
) -> None:
    with _pd(gguf_path, tmp_path, enable_prefix_caching=False) as llm:
        prompt = list(range(1, 30))
        params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        outs = llm.generate([prompt, prompt], params)
    assert all(o.metrics is not None and o.metrics.num_cached_tokens == 0 for o in outs)


def _pd(gguf_path: Path, tmp_path: Path, pd_config: PDConfig | None = None, **kwargs: Any) -> LLM:
    return LLM(
        str(gguf_path), engine_config=ENGINE, cache_dir=tmp_path, pd=pd_config or True, **kwargs
    )


@pytest.mark.parametrize("router", ["prefix_affinity", "least_loaded"])
def test_next_turns_follow_their_prefill_worker_cache(
    gguf_path: Path, tmp_path: Path, router: str
) -> None:
    """Two conversations, two prefill workers. Second turns arrive in the other order: the
    default prefix-affinity router sends each back to the worker holding its first turn (both
    hit); least-loaded routing sends them by load alone (both miss)."""
    vocab = tiny_config().vocab_size
    first = [[(11 * j + 3 + c) % vocab for j in range(30)] for c in range(2)]
    second = [f + [(5 * j + 1 + c) % vocab for j in range(12)] for c, f in enumerate(first)]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    cache = PrefixCacheConfig(device_blocks=8, host_bytes=1 << 20, disk_bytes=0)
    config = PDConfig(num_prefill_workers=2, router=router)
    with _pd(gguf_path, tmp_path, prefix_cache_config=cache, pd_config=config) as llm:
        llm.generate(first, params)
        outs = llm.generate(second[::-1], params)
    cached = [o.metrics.num_cached_tokens if o.metrics else -1 for o in outs]
    assert cached == ([24, 24] if router == "prefix_affinity" else [0, 0])


def test_decode_workers_run_dspark_losslessly(
    gguf_path: Path,
    prompts: list[list[int]],
    params: list[SamplingParams],
    colocated: list[RequestOutput],
    tmp_path: Path,
) -> None:
    """``LLM(pd=..., speculative=<checkpoint>)``: each decode worker loads the drafter, first
    recomputes the handed-off prompt's drafter context, and verifies drafts; greedy output is
    the colocated plain engine's, and drafts were accepted (the counters reach the caller)."""
    from deepinfer.models import load_model
    from deepinfer_spec.training import save_drafter

    loaded = load_model(str(gguf_path), cache_dir=tmp_path / "convert")
    drafter = spec_helpers.oracle_drafter(loaded.model, [o.token_ids for o in colocated])
    ckpt = save_drafter(drafter, tmp_path / "drafter")
    # A fixed verify count and no gate: whether drafting pays on a loaded machine (the start-up
    # profile the default scheduler and gate price drafts with) is not what this test is about.
    spec = SpeculativeConfig(os.fspath(ckpt), num_speculative_tokens=3, draft_gate=False)
    with LLM(
        str(gguf_path), engine_config=ENGINE, cache_dir=tmp_path, pd=True, speculative=spec
    ) as llm:
        outs = llm.generate(prompts, params)
    for i, (got, want) in enumerate(zip(outs, colocated)):
        assert got.error is None, got.error
        assert got.token_ids == want.token_ids, f"prompt {i} (len {len(prompts[i])})"
    metrics = [o.metrics for o in outs if o.metrics is not None]
    assert sum(m.num_accepted_drafts for m in metrics) > 0
    assert all(m.num_accepted_drafts <= m.num_verified_drafts for m in metrics)


def test_pd_refuses_a_drafter_object(gguf_path: Path, tmp_path: Path) -> None:
    from deepinfer.models import load_model

    loaded = load_model(str(gguf_path), cache_dir=tmp_path)
    drafter = spec_helpers.oracle_drafter(loaded.model, [[1, 2, 3]])
    with pytest.raises(ValueError, match="speculative: with pd"):
        LLM(str(gguf_path), engine_config=ENGINE, cache_dir=tmp_path, pd=True, speculative=drafter)
