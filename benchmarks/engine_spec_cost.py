"""What DSpark costs and gains in the engine on this machine, against plain decoding.

1. Forced drafting: decode-step time with ``FixedGammaScheduler(g)`` and no gate (every step
   drafts and verifies ``g`` drafts) against a plain step, on the chat prompt; the tau at which
   a ``g``-draft step breaks even is the ratio of the two. The 1-draft step also with the
   drafter's torch modules instead of its compiled greedy block (same run, alternated). Also
   one drafter forward (``deepinfer.speculative.time_draft``).
2. As shipped: plain decoding against ``LLM(speculative="dspark")`` (the priced draft gate) on
   the code-editing and chat prompts of ``vs_transformers.py``, interleaved runs in one process.
3. The speculator's own per-step cost: the same engine with a gate that never opens (every
   step is a plain step plus the drafter-context bookkeeping) against plain decoding.

    .venv/bin/python benchmarks/engine_spec_cost.py --tokens 48 --repeats 3
    .venv/bin/python benchmarks/engine_spec_cost.py --threads 1 --cpu-time  # loaded machine

With ``--cpu-time`` the figures are CPU seconds of the process (one torch thread: another
process's preemption does not count), tok/s "per CPU second"; the draft gate still times its
own steps by the wall clock, as it does in service.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from vs_transformers import CHAT_MESSAGES, CODE_PROMPT

from deepinfer import LLM, EngineConfig, SamplingParams, SpeculativeConfig
from deepinfer.models import load_model
from deepinfer.speculative import profile_target_sps, time_draft
from deepinfer_kernels.cpu import ModuleLinear
from deepinfer_spec import DraftGate, module_linear


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=48, help="new tokens per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by the process's CPU seconds (robust to a loaded machine; use --threads 1)",
    )
    args = p.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    loaded = load_model()
    tok = loaded.tokenizer
    cfg = EngineConfig(num_blocks=1024, max_num_seqs=32)
    chat_ids = tok.encode(loaded.chat_template.render(CHAT_MESSAGES))
    code_ids = tok.encode(CODE_PROMPT)
    n = args.tokens
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def build() -> LLM:
        return LLM(loaded, engine_config=cfg, enable_prefix_caching=False)

    # 1. forced drafting
    plain = build()
    engines = {"plain": plain}
    for g in (1, 3, 5):
        # Through the composition root: a speculator assigned to a built engine afterwards is
        # never consulted (its stats stayed at zero and the "forced" rows timed plain decoding).
        engines[f"{g} drafts"] = LLM(
            loaded,
            engine_config=cfg,
            enable_prefix_caching=False,
            speculative=SpeculativeConfig("dspark", num_speculative_tokens=g, draft_gate=False),
        )
    spec_1 = engines["1 drafts"].engine.speculator
    assert spec_1 is not None
    drafter = spec_1.drafter  # type: ignore[attr-defined]
    # The drafter's products: the one build_speculator timed fastest here, against each option.
    panels = ModuleLinear(loaded.model.cpu_kernels.linear)
    chosen = drafter.linear
    native = drafter.native
    print(
        f"drafter products chosen at start-up: {type(chosen).__name__}; greedy block "
        + ("compiled (one call)" if native is not None else "on the modules (no compiler)")
    )
    if native is not None:
        print(
            f"one drafter forward, compiled block: {1e3 * time_draft(drafter, repeats=10):.1f} ms"
        )
    drafter.use_native(None)
    for label, fn in (("bf16 panels", panels), ("modules (MKL)", module_linear)):
        drafter.use_linear(fn)
        print(f"one drafter forward, {label}: {1e3 * time_draft(drafter, repeats=10):.1f} ms")
    drafter.use_linear(chosen)
    drafter.use_native(native)
    gamma = drafter.config.gamma
    full_ms, one_ms = [], []
    for _ in range(5):  # alternated: drawing all gamma positions vs the first only
        full_ms.append(1e3 * time_draft(drafter, repeats=2))
        one_ms.append(1e3 * time_draft(drafter, repeats=2, num_tokens=1))
    print(
        f"one drafter forward, {gamma} positions drawn: {statistics.median(full_ms):.1f} ms; "
        f"1 position (FixedGammaScheduler(1)'s bound): {statistics.median(one_ms):.1f} ms "
        f"({min(o / f for o, f in zip(one_ms, full_ms)):.2f}-"
        f"{max(o / f for o, f in zip(one_ms, full_ms)):.2f}x)"
    )
    forced = LLM(
        loaded,
        engine_config=cfg,
        enable_prefix_caching=False,
        speculative=SpeculativeConfig("dspark", num_speculative_tokens=1, draft_gate=False),
    )
    forced.engine.speculator.drafter.use_linear(panels)  # type: ignore[union-attr]
    forced.engine.speculator.drafter.use_native(None)  # type: ignore[union-attr]
    engines["1 drafts, torch modules on bf16 panels"] = forced
    modules = LLM(
        loaded,
        engine_config=cfg,
        enable_prefix_caching=False,
        speculative=SpeculativeConfig("dspark", num_speculative_tokens=1, draft_gate=False),
    )
    modules.engine.speculator.drafter.use_native(None)  # type: ignore[union-attr]
    engines["1 drafts, torch modules (start-up's products)"] = modules
    # What verifying k drafts adds to the target's forward (k + 1 tokens against 1).
    sizes = (1, 2, 3, 4, 6)
    curve = profile_target_sps(
        loaded.model, plain.engine.pool, sizes, context=len(chat_ids), repeats=5
    )
    print(
        "target forward of B tokens / 1 token: "
        + ", ".join(f"B={b}: {curve.at(1) / curve.at(b):.2f}x" for b in sizes[1:])
    )
    step_ms: dict[str, list[float]] = {k: [] for k in engines}
    for llm in engines.values():
        llm.generate([chat_ids], params)
    for _ in range(args.repeats):
        for name, llm in engines.items():
            # The decode steps alone: a one-token run times the prefill and the first token.
            start = clock()
            llm.generate([chat_ids], first)
            prefill = clock() - start
            stats = getattr(llm.engine.speculator, "stats", None)
            emitted0 = stats.num_emitted if stats is not None else 0
            steps0 = stats.num_steps if stats is not None else 0
            start = clock()
            llm.generate([chat_ids], params)
            decode = clock() - start - prefill
            steps = (stats.num_steps - steps0) if stats is not None else n - 1
            step_ms[name].append(1e3 * decode / max(1, steps))
            if stats is not None:
                tau = (stats.num_emitted - emitted0) / max(1, stats.num_steps - steps0)
                step_ms.setdefault(f"{name} tau", []).append(tau)
    base = statistics.median(step_ms["plain"])
    print(f"plain decode step: {base:.1f} ms")
    for name in engines:
        if name == "plain":
            continue
        ms = statistics.median(step_ms[name])
        print(
            f"{name}: step {ms:.1f} ms ({ms / base:.2f}x plain, range "
            f"{min(step_ms[name]) / max(step_ms['plain']):.2f}-"
            f"{max(step_ms[name]) / min(step_ms['plain']):.2f}: breaks even at tau "
            f"{ms / base:.2f}); tau on the chat prompt {statistics.median(step_ms[f'{name} tau']):.2f}"
        )

    # 2. as shipped
    spec = LLM(loaded, engine_config=cfg, enable_prefix_caching=False, speculative="dspark")
    speculator = spec.engine.speculator
    assert speculator is not None
    gate = speculator.gate  # type: ignore[attr-defined]
    print(
        f"priced gate: drafting pays from {gate.break_even_accepted:.2f} accepted drafts per row "
        f"(min_accepted {gate.min_accepted:.2f})"
    )
    for name, ids in (("code-editing", code_ids), ("chat", chat_ids)):
        runs: dict[str, list[float]] = {"plain": [], "dspark": []}
        for llm in (plain, spec):
            llm.generate([ids], params)
        st = speculator.stats  # type: ignore[attr-defined]
        rows0, emit0, steps0, gated0 = st.num_rows, st.num_emitted, st.num_steps, st.num_gated_steps
        verified0 = st.num_verified
        for _ in range(args.repeats):
            for key, llm in (("plain", plain), ("dspark", spec)):
                start = clock()
                llm.generate([ids], params)
                runs[key].append(n / (clock() - start))
        tau = (st.num_emitted - emit0) / max(1, st.num_rows - rows0)
        p_med, s_med = (statistics.median(runs[k]) for k in ("plain", "dspark"))
        print(
            f"{name}: plain {p_med:.1f} tok/s, dspark {s_med:.1f} tok/s ({s_med / p_med:.2f}x); "
            f"drafting steps {st.num_steps - steps0}, gated {st.num_gated_steps - gated0}, "
            f"tau {tau:.2f}, verified drafts per drafting row "
            f"{(st.num_verified - verified0) / max(1, st.num_rows - rows0):.2f}"
        )
        measured = gate.measured_break_even(1)
        print(
            f"  gate after {name}: measured break-even "
            + ("(too few timed steps)" if measured is None else f"{measured:.2f}")
            + f" accepted drafts per row at batch 1; mean accepted {gate.mean_accepted or 0.0:.2f}"
        )

    # 3. bookkeeping only
    closed = DraftGate(min_accepted=float("inf"), probe_every=2**31 - 1, warmup_rows=0)
    closed.record(num_rows=1, num_accepted=0)
    speculator.gate = closed  # type: ignore[attr-defined]
    runs = {"plain": [], "never drafting": []}
    for _ in range(2 * args.repeats):
        for key, llm in (("plain", plain), ("never drafting", spec)):
            start = clock()
            llm.generate([code_ids], params)
            runs[key].append(n / (clock() - start))
    p_med, s_med = (statistics.median(runs[k]) for k in ("plain", "never drafting"))
    print(
        f"bookkeeping only (code prompt): plain {p_med:.1f} tok/s, DSpark engine with a closed "
        f"gate {s_med:.1f} tok/s ({s_med / p_med:.2f}x)"
    )


if __name__ == "__main__":
    main()
