"""Decode speed of the model runner on CPU: attention planned once per forward vs once per layer,
against Hugging Face transformers, all in one process with the rounds interleaved.

Usage: python benchmarks/model_runner_attention_plan.py [--threads 1] [--prompt-len 128]
[--decode 16] [--rounds 3]

Modes (embedded SmolLM2-135M, fp32, greedy, decode steps only, prefill excluded):

* ``plan``: ``LlamaModel.forward`` as shipped: ``plan_paged_attention`` once per forward,
  ``plan.run`` in each of the 30 layers.
* ``per-layer``: the same layers, each calling the public ``paged_attention`` op (the call
  pattern before the plan existed: the batch is re-planned and re-validated in every layer).
* ``transformers``: ``LlamaForCausalLM`` with its dynamic KV cache, one token per step.

On a shared machine the load changes between rounds, so each mode reports its best round.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from deepinfer.models import AttentionMetadata, KVPool, LlamaModel, load_model


def _forward_per_layer(
    model: LlamaModel, ids: torch.Tensor, attn: AttentionMetadata, pool: KVPool
) -> torch.Tensor:
    """``LlamaModel.forward`` with ``plan=None``: the public op in every layer."""
    positions = attn.positions()
    cos, sin = model.rope.cos_sin(positions, model.norm.weight.dtype)
    residual = model.embed(ids)
    for i, layer in enumerate(model.decoder_layers()):
        residual = residual + layer.self_attn.forward(
            layer.input_layernorm.forward(residual), cos, sin, model.rope, attn,
            pool.k_cache(i), pool.v_cache(i), check_values=i == 0,
        )  # fmt: skip
        residual = residual + layer.mlp.forward(layer.post_attention_layernorm.forward(residual))
    return model.norm.forward(residual)


def _ours(
    model: LlamaModel, pool: KVPool, ids: torch.Tensor, decode: int, per_layer: bool
) -> float:
    batch, prompt_len = ids.shape
    bs = pool.block_size
    tables = [pool.allocate(-(-(prompt_len + decode) // bs)) for _ in range(batch)]
    forward: Callable[..., torch.Tensor] = _forward_per_layer if per_layer else LlamaModel.forward
    try:
        for b in range(batch):
            attn = AttentionMetadata.build([tables[b]], [prompt_len], [prompt_len], bs)
            model(ids[b], attn.positions(), attn, pool)
        nxt = ids[:, -1]
        t0 = time.perf_counter()
        for step in range(decode):
            attn = AttentionMetadata.build(tables, [prompt_len + step + 1] * batch, [1] * batch, bs)
            hidden = (
                forward(model, nxt, attn, pool)
                if per_layer
                else forward(model, nxt, attn.positions(), attn, pool)
            )
            nxt = model.compute_logits(hidden).argmax(-1)
        return batch * decode / (time.perf_counter() - t0)
    finally:
        for t in tables:
            pool.free(t)


def _transformers(hf: torch.nn.Module, ids: torch.Tensor, decode: int) -> float:
    out = hf(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    t0 = time.perf_counter()
    for _ in range(decode):
        out = hf(input_ids=nxt, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return ids.shape[0] * decode / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import LlamaForCausalLM

    loaded = load_model(dtype=torch.float32)
    model = loaded.model
    hf = LlamaForCausalLM.from_pretrained(loaded.path, dtype=torch.float32).eval()
    pool = KVPool.for_model(loaded.config, num_blocks=512, block_size=16, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    with torch.inference_mode():
        for batch in (1, 8):
            ids = torch.randint(
                0, loaded.config.vocab_size, (batch, args.prompt_len), generator=gen
            )
            best = {"plan": 0.0, "per-layer": 0.0, "transformers": 0.0}
            _ours(model, pool, ids[:, :16], 2, False)  # warm-up
            for _ in range(args.rounds):
                best["plan"] = max(best["plan"], _ours(model, pool, ids, args.decode, False))
                best["per-layer"] = max(
                    best["per-layer"], _ours(model, pool, ids, args.decode, True)
                )
                best["transformers"] = max(
                    best["transformers"], _transformers(hf, ids, args.decode)
                )
            print(
                f"batch {batch}: decode tok/s  plan {best['plan']:.1f}  "
                f"per-layer {best['per-layer']:.1f}  transformers {best['transformers']:.1f}  "
                f"| plan / per-layer {best['plan'] / best['per-layer']:.2f}x  "
                f"plan / transformers {best['plan'] / best['transformers']:.2f}x"
            )


if __name__ == "__main__":
    main()
