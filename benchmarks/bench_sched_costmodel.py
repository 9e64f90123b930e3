"""Reference timings of the roofline cost model for every shipped hardware x model pair.

Run: .venv/bin/python benchmarks/bench_sched_costmodel.py
Prints a Markdown table: KV bytes per token, KV capacity, prefill of a 77k prompt cold and
with 96% of it cached, a decode step at batch 1 and 64 (77k context each), KV transfer of
77k tokens. Defaults: mfu 0.5, HBM efficiency 0.8, 2 ms step overhead.
"""

from __future__ import annotations

from deepinfer_sched.costmodel import (
    RooflineCostModel,
    available_hardware,
    available_models,
    load_hardware,
    load_model,
)

GPUS = {"dense-8b": 1, "dense-70b": 4, "deepseek-v3": 16}


def main() -> None:
    ctx = 77_000
    cached = int(0.96 * ctx)
    print(
        "| model | hw | GPUs | KV B/token | KV capacity (tokens) | prefill 77k cold (s) "
        "| prefill 77k, 96% cached (s) | decode step B=1 (ms) | decode step B=64 (ms) "
        "| KV transfer 77k (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in available_models():
        for h in available_hardware():
            g = GPUS.get(m, 8)
            cm = RooflineCostModel(load_hardware(h), load_model(m), num_gpus=g)
            print(
                f"| {m} | {h} | {g} | {cm.kv_bytes_per_token} | {cm.kv_capacity_tokens():,} "
                f"| {cm.prefill_time(ctx):.2f} | {cm.prefill_time(ctx - cached, cached):.3f} "
                f"| {cm.decode_step_time(1, ctx) * 1e3:.1f} "
                f"| {cm.decode_step_time(64, 64 * ctx) * 1e3:.1f} "
                f"| {cm.kv_transfer_time(ctx) * 1e3:.1f} |"
            )


if __name__ == "__main__":
    main()
