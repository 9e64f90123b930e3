"""DSpark inside the engine: lossless greedy, sampling limits, mixed batches, prefix-cache gaps.

The drafter is an "oracle" built at test time: its Markov head carries a large bigram bias
learned from the plain engine's own greedy outputs, so drafts are often (not always) right and
every path (full acceptance, partial rejection, ragged verify lengths) is exercised.
"""

from __future__ import annotations

import functools
import time

import pytest
import spec_helpers
import torch
from model_helpers import random_hf_state, tiny_config

from deepinfer.engine.config import EngineConfig, SpeculativeConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.models import KVPool, build_model
from deepinfer.models.spec_adapter import LlamaTargetAdapter
from deepinfer.speculative import (
    DSparkSpeculator,
    build_speculator,
    fastest_linear,
    profile_target_sps,
)
from deepinfer_kernels.cpu.module_linear import ModuleLinear
from deepinfer_spec import (
    DraftGate,
    DSparkConfig,
    DSparkDrafter,
    FixedGammaScheduler,
    PrefixScheduler,
    SpecDecoder,
    SPSCurve,
    apply_temperatures,
    module_linear,
)

WINDOW = 8
CFG = EngineConfig(block_size=4, num_blocks=256, max_num_seqs=8, max_batched_tokens=24)


@pytest.fixture(scope="module")
def model():
    cfg = tiny_config(max_position_embeddings=512)
    return build_model(cfg, random_hf_state(cfg, seed=11))


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    lengths = [1, 3, 7, 12, 21, 30]  # several longer than the drafter's window
    return [torch.randint(3, 200, (n,), generator=gen).tolist() for n in lengths]


def run(engine: LLMEngine, reqs: list[tuple[list[int], SamplingParams]], stagger: int = 0):
    """Drive ``engine``; request ``i`` is added after ``i * stagger`` steps. Returns outputs."""
    pending = list(enumerate(reqs))
    done: dict[str, object] = {}
    steps = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] * stagger <= steps:
            i, (prompt, params) = pending.pop(0)
            engine.add_request(prompt, params, request_id=str(i))
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        steps += 1
    return [done[str(i)] for i in range(len(reqs))]


def plain_engine(model) -> LLMEngine:
    return LLMEngine(model, None, CFG)


def oracle_drafter(model, outputs: list[list[int]], seed: int = 0) -> DSparkDrafter:
    return spec_helpers.oracle_drafter(model, outputs, seed, window=WINDOW)


class RecordingSpeculator(DSparkSpeculator):
    """Records, per step, (prefill tokens, verify lengths) to prove mixed ragged batches ran."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[int, list[int]]] = []

    def propose(self, batch):
        prefill = sum(c.length for c in batch.chunks if c.seq.num_computed < c.seq.prefill_target)
        drafts = super().propose(batch)
        self.steps.append((prefill, [len(drafts.tokens[i]) for i in drafts.plan.drafting]))
        return drafts


class DraftCollector(DSparkSpeculator):
    """Keeps every token it sent to verification."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drafted: list[int] = []

    def propose(self, batch):
        drafts = super().propose(batch)
        self.drafted.extend(t for row in drafts.tokens for t in row)
        return drafts


def spec_engine(model, drafter, scheduler=None, cls=DSparkSpeculator) -> LLMEngine:
    spec = cls(drafter, scheduler or PrefixScheduler(SPSCurve.flat()), max_seqs=CFG.max_num_seqs)
    return LLMEngine(model, None, CFG, speculator=spec)


@pytest.fixture(scope="module")
def greedy_reference(model):
    reqs = [(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)) for p in prompts()]
    outs = run(plain_engine(model), reqs)
    return reqs, [o.token_ids for o in outs]


def test_greedy_spec_equals_plain_greedy(model, greedy_reference) -> None:
    reqs, expected = greedy_reference
    engine = spec_engine(model, oracle_drafter(model, expected))
    outs = run(engine, reqs)
    assert [o.token_ids for o in outs] == expected
    verified = sum(o.metrics.num_verified_drafts for o in outs)
    accepted = sum(o.metrics.num_accepted_drafts for o in outs)
    steps = sum(o.metrics.num_spec_steps for o in outs)
    # Both paths ran: many drafts accepted, some rejected; fewer steps than tokens.
    assert 0 < accepted < verified
    assert steps < sum(len(t) for t in expected)
    assert engine.speculator.stats.mean_accepted_length > 1.5


def test_a_drafter_with_a_draft_vocabulary_stays_exact(model, greedy_reference) -> None:
    reqs, expected = greedy_reference
    used = sorted({t for out in expected for t in out})
    shortlist = used[: len(used) * 3 // 4]  # a quarter of the emitted tokens can never be drafted
    drafter = oracle_drafter(model, expected).restrict_vocab(shortlist)
    engine = spec_engine(model, drafter, cls=DraftCollector)
    outs = run(engine, reqs)
    assert [o.token_ids for o in outs] == expected
    drafted = engine.speculator.drafted
    assert drafted and set(drafted) <= set(shortlist)
    assert sum(o.metrics.num_accepted_drafts for o in outs) > 0
    assert any(t not in shortlist for out in expected for t in out)  # off-list tokens emitted


def test_untrained_drafter_is_still_lossless(model, greedy_reference) -> None:
    reqs, expected = greedy_reference
    cfg = model.config
    target = LlamaTargetAdapter(model, KVPool.for_model(cfg, num_blocks=4, block_size=4))
    torch.manual_seed(1)
    drafter = DSparkDrafter(DSparkConfig(target_layer_ids=(1,), gamma=3, window=WINDOW), target)
    engine = spec_engine(model, drafter.eval(), FixedGammaScheduler(3))
    assert [o.token_ids for o in run(engine, reqs)] == expected


def test_stop_token_mid_block_truncates(model, greedy_reference) -> None:
    reqs, expected = greedy_reference
    drafter = oracle_drafter(model, expected)
    # Stop at a token first produced mid-sequence; everything after it must be dropped.
    stop_reqs, want = [], []
    for (prompt, _), out in zip(reqs, expected):
        stop = out[5]
        cut = out.index(stop) + 1
        stop_reqs.append(
            (
                prompt,
                SamplingParams(
                    temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop]
                ),
            )
        )
        want.append(out[:cut])
    outs = run(spec_engine(model, drafter), stop_reqs)
    assert [o.token_ids for o in outs] == want
    assert all(o.finish_reason == "stop" for o in outs)
    # max_tokens reached mid-block: exactly max_tokens tokens, the plain prefix.
    limited = [(p, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)) for p, _ in reqs]
    outs = run(spec_engine(model, drafter), limited)
    assert [o.token_ids for o in outs] == [e[:7] for e in expected]
    assert all(o.finish_reason == "length" for o in outs)


def test_mixed_batch_with_ragged_verify_lengths(model, greedy_reference) -> None:
    reqs, expected = greedy_reference
    engine = spec_engine(model, oracle_drafter(model, expected), cls=RecordingSpeculator)
    outs = run(engine, reqs, stagger=2)
    assert [o.token_ids for o in outs] == expected
    steps = engine.speculator.steps
    assert any(prefill > 0 and verify for prefill, verify in steps), "no mixed step ran"
    assert any(len(set(v)) > 1 for _, v in steps), "verify lengths were never ragged"


def test_sampling_respects_max_tokens_and_stop(model, greedy_reference) -> None:
    _, expected = greedy_reference
    engine = spec_engine(model, oracle_drafter(model, expected))
    stop = 7
    reqs = [
        (p, SamplingParams(temperature=0.8, top_k=50, max_tokens=n, stop_token_ids=[stop], seed=s))
        for s, (p, n) in enumerate(zip(prompts(), [1, 5, 9, 13, 17, 30]))
    ]
    reqs.append((prompts()[2], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)))
    outs = run(engine, reqs, stagger=1)
    vocab = model.config.vocab_size
    for (_, params), out in zip(reqs, outs):
        toks = out.token_ids
        assert 1 <= len(toks) <= params.max_tokens
        assert all(0 <= t < vocab for t in toks)
        if out.finish_reason == "length":
            assert len(toks) == params.max_tokens
        else:
            assert out.finish_reason == "stop" and toks[-1] in (stop, *model.config.eos_token_ids)
        assert stop not in toks[:-1] and not set(model.config.eos_token_ids) & set(toks[:-1])
    assert outs[-1].token_ids == expected[2][:10]  # a greedy row in a sampling batch stays exact
    assert engine.speculator.stats.num_verified > 0


def test_sampled_drafts_come_from_the_engines_seeded_generator(model) -> None:
    """Two engines with the same seed give the same sampled output whatever torch's global
    generator holds: the drafter draws from the engine's generator, not the global one."""
    cfg = model.config
    target = LlamaTargetAdapter(model, KVPool.for_model(cfg, num_blocks=4, block_size=4))
    torch.manual_seed(1)
    # An untrained drafter's distributions are wide, so its sampled drafts depend on the draws.
    drafter = DSparkDrafter(DSparkConfig(target_layer_ids=(1,), gamma=3, window=WINDOW), target)
    reqs = [(p, SamplingParams(temperature=1.0, max_tokens=16)) for p in prompts()[:4]]
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        engine = spec_engine(model, drafter.eval(), FixedGammaScheduler(3))
        runs.append([o.token_ids for o in run(engine, reqs)])
        assert engine.speculator.stats.num_verified > 0
    assert runs[0] == runs[1]


class _CopyCache:
    """A toy prefix cache keeping copies of whole KV blocks (enough to create ring gaps)."""

    def __init__(self, pool: KVPool, block_size: int) -> None:
        self.pool, self.bs = pool, block_size
        self.blocks: dict[tuple[int, ...], torch.Tensor] = {}

    def num_cached_tokens(self, tokens, namespace=b"") -> int:
        n = 0
        while tuple(tokens[: n + self.bs]) in self.blocks and n + self.bs <= len(tokens):
            n += self.bs
        return n

    def load(self, tokens, namespace, device_block_ids) -> int:
        for i, block in enumerate(device_block_ids):
            key = tuple(tokens[: (i + 1) * self.bs])
            if key not in self.blocks:
                return i * self.bs
            self.pool.tensor[:, :, block] = self.blocks[key]
        return len(device_block_ids) * self.bs

    def save(self, tokens, namespace, device_block_ids, retention="chat") -> int:
        full = len(tokens) // self.bs
        for i in range(full):
            self.blocks[tuple(tokens[: (i + 1) * self.bs])] = self.pool.tensor[
                :, :, device_block_ids[i]
            ].clone()
        return full * self.bs


def test_prefix_cache_hit_rebuilds_drafter_state(model, greedy_reference) -> None:
    reqs, expected = greedy_reference
    pool = KVPool.for_model(model.config, CFG.num_blocks, CFG.block_size)
    cache = _CopyCache(pool, CFG.block_size)
    spec = DSparkSpeculator(
        oracle_drafter(model, expected), PrefixScheduler(SPSCurve.flat()), max_seqs=8
    )
    engine = LLMEngine(model, None, CFG, prefix_cache=cache, pool=pool, speculator=spec)
    first = run(engine, reqs)
    assert [o.token_ids for o in first] == expected
    again = run(engine, reqs)  # prompts now hit the cache: the ring must be rebuilt
    assert any(o.metrics.num_cached_tokens > WINDOW for o in again)
    assert [o.token_ids for o in again] == expected
    assert sum(o.metrics.num_accepted_drafts for o in again) > 0


def test_profile_target_sps_returns_a_curve_and_frees_blocks(model) -> None:
    pool = KVPool.for_model(model.config, 64, 4)
    free = pool.num_free_blocks
    curve = profile_target_sps(model, pool, (1, 4, 8), context=8, repeats=1, warmup=0)
    assert curve.batch_sizes == (1, 4, 8)
    assert all(s > 0 for s in curve.steps_per_second)
    assert pool.num_free_blocks == free
    with pytest.raises(ValueError, match="free blocks"):
        profile_target_sps(model, KVPool.for_model(model.config, 2, 4), (64,), context=8)


def test_num_lookahead_caps(model, greedy_reference) -> None:
    _, expected = greedy_reference
    spec = DSparkSpeculator(
        oracle_drafter(model, expected), PrefixScheduler(SPSCurve.flat()), max_seqs=2
    )
    engine = LLMEngine(model, None, CFG, speculator=spec)
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=3))
    seq = engine.waiting[0]
    assert spec.num_lookahead(seq, 100) == 2  # max_tokens - 0 generated - 1
    assert spec.num_lookahead(seq, 5) == 2
    assert spec.num_lookahead(seq, 4) == 1  # context room
    seq.output_ids.extend([1, 1])
    assert spec.num_lookahead(seq, 100) == 0
    with pytest.raises(ValueError, match="max_seqs"):
        DSparkSpeculator(spec.drafter, spec.scheduler, max_seqs=0)
    with pytest.raises(ValueError, match="sts_greedy"):
        DSparkSpeculator(spec.drafter, spec.scheduler, max_seqs=1, sts_greedy=torch.ones(2))


def test_draft_gate_pauses_a_useless_drafter_and_stays_lossless(model, greedy_reference) -> None:
    """A drafter that always proposes a token the target never emits, behind a DraftGate:
    most steps stop drafting, and the outputs are unchanged."""
    reqs, expected = greedy_reference
    never = next(t for t in range(model.config.vocab_size) if all(t not in o for o in expected))
    drafter = oracle_drafter(model, [])
    with torch.no_grad():
        drafter.markov_out.weight[never] = 60.0  # every successor is `never`
    gate = DraftGate(min_accepted=0.5, probe_every=4, warmup_rows=4)
    spec = DSparkSpeculator(drafter, FixedGammaScheduler(3), max_seqs=8, gate=gate)
    engine = LLMEngine(model, None, CFG, speculator=spec)
    assert [o.token_ids for o in run(engine, reqs)] == expected
    assert gate.mean_accepted == 0.0
    assert spec.stats.num_gated_steps == gate.num_skipped > 0
    assert spec.stats.num_steps > 0  # the probes still drafted


class UntimedGate(DraftGate):
    """A gate that ignores step times (the timed rule is tested with given times) and keeps
    what it was told, to check which steps the engine times."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timed: list[tuple[str, int, float | None]] = []

    def record(self, num_rows, num_accepted, seconds=None) -> None:
        self.timed.append(("draft", num_rows, seconds))
        super().record(num_rows, num_accepted)

    def record_plain(self, num_rows, seconds) -> None:
        self.timed.append(("plain", num_rows, seconds))


def test_draft_gate_keeps_a_good_drafter_drafting(model, greedy_reference) -> None:
    reqs, expected = greedy_reference
    gate = UntimedGate(min_accepted=0.25, probe_every=4, warmup_rows=4)
    spec = DSparkSpeculator(
        oracle_drafter(model, expected), FixedGammaScheduler(3), max_seqs=8, gate=gate
    )
    engine = LLMEngine(model, None, CFG, speculator=spec)
    assert [o.token_ids for o in run(engine, reqs)] == expected
    assert spec.stats.num_gated_steps == 0


def test_engine_times_only_decode_steps_for_the_gate(model, greedy_reference) -> None:
    """Steps with a prefill chunk in them are never timed (their cost is not the drafting's);
    pure decode steps are, drafting or gated."""
    reqs, expected = greedy_reference
    gate = UntimedGate(min_accepted=0.25, probe_every=2, warmup_rows=0)
    spec = DSparkSpeculator(
        oracle_drafter(model, expected), FixedGammaScheduler(3), max_seqs=8, gate=gate
    )
    engine = LLMEngine(model, None, CFG, speculator=spec)
    assert [o.token_ids for o in run(engine, reqs, stagger=3)] == expected
    timed = [t for t in gate.timed if t[2] is not None]
    assert timed and all(seconds > 0 for _, _, seconds in timed)
    # Staggered arrivals put prefill chunks next to drafting rows: those steps are untimed.
    assert any(seconds is None for kind, _, seconds in gate.timed if kind == "draft")


def test_speculator_rejects_a_bad_gate(model, greedy_reference) -> None:
    _, expected = greedy_reference
    with pytest.raises(TypeError, match="gate"):
        DSparkSpeculator(
            oracle_drafter(model, expected), FixedGammaScheduler(3), max_seqs=2, gate=0.5
        )  # type: ignore[arg-type]


def test_build_speculator_gate_option(model, greedy_reference) -> None:
    _, expected = greedy_reference
    pool = KVPool.for_model(model.config, 16, 4)
    drafter = oracle_drafter(model, expected)
    build = functools.partial(
        build_speculator, drafter, model, pool, max_seqs=2, scheduler=FixedGammaScheduler(3)
    )
    assert drafter.linear is module_linear
    default = build().gate
    # A CPU drafter on its modules' own products gets the faster of the model's products and
    # its own, as timed on this machine (fastest_linear; its choice is tested on its own).
    assert isinstance(drafter.linear, ModuleLinear) or drafter.linear is module_linear
    assert isinstance(default, DraftGate)
    # The default gate is priced on this machine: the drafter's measured forward and the
    # target's profiled step times.
    assert default.break_even_accepted is not None and default.break_even_accepted > 0
    assert default.min_accepted == max(0.25, default.break_even_accepted)
    assert build(gate=None).gate is None
    mine = DraftGate(min_accepted=1.0)
    assert build(gate=mine).gate is mine
    with pytest.raises(ValueError, match="gate"):
        build(gate="sometimes")
    # A LinearFn the caller chose is kept.
    other = oracle_drafter(model, expected)
    other.use_linear(spec_module_linear)
    build_speculator(other, model, pool, max_seqs=2, scheduler=FixedGammaScheduler(3), gate=None)
    assert other.linear is spec_module_linear


def test_speculative_config_fixes_the_verify_count_and_gate(
    model, greedy_reference, tmp_path
) -> None:
    """``SpeculativeConfig`` (what crosses into PD workers and replicas): a fixed verify count
    replaces the profiled prefix scheduler, ``draft_gate=False`` drafts on every step; the
    engine stays lossless with it; bad fields are named."""
    from deepinfer_spec.training import save_drafter

    reqs, expected = greedy_reference
    ckpt = save_drafter(oracle_drafter(model, expected), tmp_path / "drafter")
    pool = KVPool.for_model(model.config, 256, 4)
    spec = build_speculator(
        SpeculativeConfig(str(ckpt), num_speculative_tokens=2, draft_gate=False),
        model,
        pool,
        max_seqs=8,
    )
    assert isinstance(spec.scheduler, FixedGammaScheduler) and spec.scheduler.gamma == 2
    assert spec.gate is None
    default = build_speculator(SpeculativeConfig(str(ckpt)), model, pool, max_seqs=8)
    assert isinstance(default.scheduler, PrefixScheduler)
    assert isinstance(default.gate, DraftGate)
    engine = LLMEngine(model, None, CFG, pool=pool, speculator=spec)
    assert [o.token_ids for o in run(engine, reqs)] == expected
    # Two drafts verified per drafting row (the drafter's gamma is 4), fewer only where a
    # request has fewer tokens left to emit.
    assert spec.stats.num_rows < spec.stats.num_verified <= 2 * spec.stats.num_rows
    assert spec.stats.num_gated_steps == 0
    for kwargs, name in (
        ({"model": ""}, "model"),
        ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"draft_gate": 1}, "draft_gate"),
    ):
        with pytest.raises(ValueError, match=name):
            SpeculativeConfig(**kwargs)
    cfg = SpeculativeConfig(str(ckpt), 3, False)
    assert SpeculativeConfig(**cfg.to_dict()) == cfg


def spec_module_linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    return torch.nn.functional.linear(x, layer.weight, layer.bias)


class ContextRecorder(DSparkSpeculator):
    """Records, for each drafting row, the tokens before its anchor and the context it drafted
    from (the ring's valid rows, after the pending features were projected)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[list[int], torch.Tensor]] = []

    def propose(self, batch):
        drafts = super().propose(batch)
        seqs = [batch.chunks[i].seq for i in drafts.plan.drafting]
        if not seqs:
            return drafts
        context, valid = self.spec.context.view([s.seq_id for s in seqs])
        for i, (seq, row) in enumerate(
            zip(seqs, (drafts.plan.rows[j] for j in drafts.plan.drafting))
        ):
            history = list(seq.all_ids[: row.start])
            self.seen.append((history, context[i][valid[i]].clone()))
        return drafts


def test_lazily_projected_context_equals_the_eager_projection(model, greedy_reference) -> None:
    """Steps that do not draft only queue raw features; when a row drafts, its context must be
    exactly the drafter's keys and values (context_kv) of the projection of the target's
    features of the last ``window`` positions, also after several gated steps and in a batch of
    sequences flushed together."""
    reqs, expected = greedy_reference
    drafter = oracle_drafter(model, expected)
    gate = DraftGate(min_accepted=float("inf"), probe_every=3, warmup_rows=0)
    gate.record(num_rows=1, num_accepted=0)  # closed from the start: only every 3rd step drafts
    spec = ContextRecorder(drafter, FixedGammaScheduler(2), max_seqs=8, gate=gate)
    engine = LLMEngine(model, None, CFG, speculator=spec)
    assert [o.token_ids for o in run(engine, reqs, stagger=2)] == expected
    assert spec.stats.num_gated_steps > 0 and len(spec.seen) > 4
    target = drafter.target
    for history, context in spec.seen:
        assert context.shape[0] == min(WINDOW, len(history))
        features = target.score(torch.tensor([history]), list(drafter.config.target_layer_ids))
        raw = features.features[0, len(history) - context.shape[0] :]
        eager = drafter.context_kv(drafter.project_context(raw))
        torch.testing.assert_close(context, eager.to(context.dtype), atol=1e-5, rtol=1e-5)


class _SeenConfidence:
    """A ``FixedGammaScheduler`` that keeps the confidences it was asked to schedule."""

    def __init__(self, gamma: int) -> None:
        self.inner = FixedGammaScheduler(gamma)
        self.seen: list[torch.Tensor] = []

    def schedule(self, confidence: torch.Tensor) -> torch.Tensor:
        self.seen.append(confidence.detach().clone())
        return self.inner.schedule(confidence)


def test_spec_decoder_and_engine_run_one_dspark_step(model, greedy_reference) -> None:
    """``SpecDecoder`` and the engine's speculator run the same DSpark step
    (``deepinfer_spec.step``): the same drafter, target and STS temperatures give identical
    tokens, and on both paths the scheduler sees the STS-calibrated confidences."""
    reqs, expected = greedy_reference
    drafter = oracle_drafter(model, expected)
    sts = torch.tensor([0.05, 0.5, 2.0, 4.0])
    assert drafter.config.gamma == sts.numel()

    def engine_run(sts: torch.Tensor | None) -> tuple[list[list[int]], _SeenConfidence]:
        seen = _SeenConfidence(3)
        spec = DSparkSpeculator(drafter, seen, max_seqs=8, sts_greedy=sts)
        outs = run(LLMEngine(model, None, CFG, speculator=spec), reqs)
        assert spec.stats.num_accepted > 0
        return [o.token_ids for o in outs], seen

    def decoder_run(sts: torch.Tensor | None) -> tuple[list[list[int]], _SeenConfidence]:
        seen = _SeenConfidence(3)
        target = LlamaTargetAdapter(model, KVPool.for_model(model.config, 256, 4))
        decoder = SpecDecoder(
            drafter, target, seen, max_requests=8, temperature=0.0, sts_greedy=sts
        )
        return decoder.generate([p for p, _ in reqs], max_new_tokens=24), seen

    for path in (engine_run, decoder_run):
        calibrated_tokens, calibrated = path(sts)
        raw_tokens, raw = path(None)
        assert calibrated_tokens == raw_tokens == expected
        # Greedy drafts and a fixed schedule: both runs take the same steps, so each step's
        # confidences are the raw ones passed through the STS temperatures.
        assert len(calibrated.seen) == len(raw.seen) > 0
        for got, base in zip(calibrated.seen, raw.seen):
            # Near the end of a request its cap leaves later positions undrawn (confidence 0).
            drawn = (base != 0).any(0)
            assert bool(drawn[0])
            torch.testing.assert_close(got[:, drawn], apply_temperatures(base, sts)[:, drawn])
            assert not got[:, ~drawn].any()
    with pytest.raises(ValueError, match="sts_greedy"):
        SpecDecoder(drafter, drafter.target, _SeenConfidence(1), sts_greedy=torch.ones(2))


class _SlowLinear:
    """The module's own product plus a fixed delay per call: a LinearFn that is always slower."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls = 0

    def __call__(self, x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        self.calls += 1
        time.sleep(self.delay_s)
        return spec_module_linear(x, layer)


def test_fastest_linear_picks_the_faster_product_and_restores_the_drafter(
    model, greedy_reference
) -> None:
    _, expected = greedy_reference
    drafter = oracle_drafter(model, expected)
    # A proposal runs ~12 products: the slow one is at least 360 ms slower. The gap must
    # dwarf the timing noise of a loaded CI runner, where one ~35 ms proposal was timed at
    # 35-290 ms (load 4 on 2 cores); 4 ms per product (48 ms) once let noise win.
    slow = _SlowLinear(0.03)
    mine = _SlowLinear(0.0)
    drafter.use_linear(mine)
    for order in ([slow, spec_module_linear], [spec_module_linear, slow]):
        assert fastest_linear(drafter, order, repeats=3) is spec_module_linear
    assert slow.calls > 0  # it was really timed, not skipped
    assert drafter.linear is mine  # the drafter's own choice is left as it was
    with pytest.raises(ValueError, match="candidates"):
        fastest_linear(drafter, [])
    with pytest.raises(ValueError, match="repeats"):
        fastest_linear(drafter, [slow], repeats=0)
