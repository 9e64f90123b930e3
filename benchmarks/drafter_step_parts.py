"""Where a DSpark drafting step's time goes on the CPU, part by part, against a plain step.

A drafting decode step is a plain step plus: the target reading the drafts too (a forward of
``1 + k`` tokens instead of 1), the drafter's proposal (backbone, base logits through the
target's head rows, the sequential head, the confidences) and the projection of the previous
step's positions into the drafter's context. Each part is timed in CPU seconds of the calling
thread with one torch thread (a loaded machine's preemption then does not count), alternated
over ``--repeats`` rounds; the figures are medians with the round-to-round range. From them:
what a drafting step costs against a plain one, and the tokens per drafting step (tau) it needs
to break even and to reach 1.3x, against the ceiling a free drafter would leave.

    .venv/bin/python benchmarks/drafter_step_parts.py --repeats 7 [--drafts 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from deepinfer import LLM, EngineConfig, SpeculativeConfig
from deepinfer.models import load_model
from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer_kernels.cpu import ModuleLinear
from deepinfer_spec import LinearFn, module_linear, propose


def cpu_ms(fn: Callable[[], object], calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return 1e3 * (time.thread_time() - start) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=5, help="calls per part per round")
    p.add_argument("--context", type=int, default=128, help="target history (tokens)")
    p.add_argument("--drafts", type=int, default=1, help="drafts verified per step (k)")
    args = p.parse_args()
    torch.set_num_threads(1)
    loaded = load_model()
    model = loaded.model
    llm = LLM(
        loaded,
        engine_config=EngineConfig(num_blocks=256, max_num_seqs=4),
        enable_prefix_caching=False,
        speculative=SpeculativeConfig("dspark", num_speculative_tokens=args.drafts),
    )
    spec = llm.engine.speculator
    assert spec is not None
    drafter = spec.drafter  # type: ignore[attr-defined]
    pool = llm.engine.pool
    k, ctx = args.drafts, args.context
    bs = pool.block_size
    blocks = pool.allocate(-(-(ctx + k + 1) // bs))
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size

    def target(length: int) -> Callable[[], object]:
        attn = AttentionMetadata.build([blocks], [ctx + length], [length], bs)
        ids = torch.randint(0, vocab, (length,), generator=gen)
        pos = torch.arange(ctx, ctx + length)

        def run() -> object:
            with torch.inference_mode():
                return model.compute_logits(model(ids, pos, attn, pool))

        return run

    with torch.inference_mode():  # a real history for the timed steps to attend to
        attn = AttentionMetadata.build([blocks], [ctx], [ctx], bs)
        model(torch.randint(0, vocab, (ctx,), generator=gen), torch.arange(ctx), attn, pool)
    weight = drafter.context_proj.weight
    window = drafter.config.window
    context = torch.randn(1, window, drafter.context_kv_dim, generator=gen).to(weight.dtype)
    valid = torch.ones(1, window, dtype=torch.bool)
    anchor = torch.zeros(1, dtype=torch.int64)
    features = torch.randn(1 + k, drafter.feature_dim, generator=gen)
    hidden = drafter.backbone(anchor, context, valid, context_is_kv=True)
    code = drafter.sequential_step(anchor, None)[1]
    # The backbone under each product the engine chooses between at start-up (a same-run A/B;
    # the choice itself is a timing, which a loaded machine can get wrong).
    chosen, panels = drafter.linear, ModuleLinear(model.cpu_kernels.linear)

    def with_linear(fn: LinearFn) -> object:
        drafter.use_linear(fn)
        try:
            return drafter.backbone(anchor, context, valid, context_is_kv=True)
        finally:
            drafter.use_linear(chosen)

    codes = code[:, None].expand(1, k, -1)
    native = drafter.native

    def on_modules(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            drafter.use_native(None)
            try:
                return fn()
            finally:
                drafter.use_native(native)

        return run

    def proposal() -> object:
        return propose(
            drafter, anchor, context, valid, temperature=0.0, context_is_kv=True, num_tokens=k
        )

    def entries() -> object:
        if drafter.native is not None:
            return drafter.native.context_kv(features)
        return drafter.context_kv(drafter.project_context(features))

    parts: dict[str, Callable[[], object]] = {
        "plain step (target, 1 token)": target(1),
        f"verify step (target, {1 + k} tokens)": target(1 + k),
        f"proposal ({k} drawn), compiled block": proposal,
        f"context entries ({1 + k} positions), compiled": entries,
        f"proposal ({k} drawn), torch modules": on_modules(proposal),
        "  backbone": lambda: drafter.backbone(anchor, context, valid, context_is_kv=True),
        "  backbone, bf16 panels": lambda: with_linear(panels),
        "  backbone, modules (MKL)": lambda: with_linear(module_linear),
        f"  base logits ({k} rows of the head)": lambda: drafter.base_logits(hidden[:, :k]),
        "  sequential step (x1)": lambda: drafter.sequential_step(anchor, None),
        "  confidence": lambda: drafter.confidence_logit(hidden[:, :k], codes),
        f"context entries ({1 + k} positions), modules": on_modules(entries),
    }
    times: dict[str, list[float]] = {name: [] for name in parts}
    with torch.no_grad():
        for fn in parts.values():
            fn()
        for _ in range(args.repeats):
            for name, fn in parts.items():
                times[name].append(cpu_ms(fn, args.calls))
    pool.free(blocks)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    plain = med["plain step (target, 1 token)"]
    print(
        f"products: {type(drafter.linear).__name__}; compiled block: "
        f"{'yes' if native is not None else 'no'}; drafter dtype {weight.dtype}; 1 thread"
    )
    for name, ts in times.items():
        print(
            f"{name:40s} {med[name]:7.2f} ms CPU ({min(ts):.2f}-{max(ts):.2f}); "
            f"{med[name] / plain:.2f} of a plain step"
        )
    verify = med[f"verify step (target, {1 + k} tokens)"]
    for how, ctx_how in (("compiled block", "compiled"), ("torch modules", "modules")):
        drafting = (
            verify
            + med[f"proposal ({k} drawn), {how}"]
            + med[f"context entries ({1 + k} positions), {ctx_how}"]
        )
        ratio = drafting / plain
        print(
            f"{how}: floor of a drafting step (verify + proposal + context entries) ~ "
            f"{ratio:.2f}x a plain step (target <= 1.25x); with a free drafter "
            f"{verify / plain:.2f}x. Tokens per drafting step needed: {ratio:.2f} to break "
            f"even, {1.3 * ratio:.2f} for 1.3x (at most {1 + k} with {k} drafts)"
        )


if __name__ == "__main__":
    main()
