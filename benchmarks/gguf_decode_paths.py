"""Batch-1 greedy decode of the embedded model on each weight path, same process, alternated,
one thread unless told otherwise:

* ``gguf-blocks``: the GGUF file's block-format weights (Q4_1/Q8_0 bytes; the default), each
  decoder layer two compiled calls (``QuantDecoderLayerKernel``);
* ``gguf-per-op``: the same weights through the per-layer torch path (one ``quant_linear``
  call per projection: the path before the fused layer, for the same-run ratio);
* ``bf16-own``: its bf16 converted copy run in fp32 from the bf16 tensors themselves
  (``deepinfer.models.half_weights``, the default for bf16 checkpoints since #24);
* ``bf16-widened``: the same bf16 copy widened to fp32 (the previous default: fp32 weights,
  bf16 panels for the compiled decoder layer, MKL-packed copies for >= 4 rows).

    .venv/bin/python benchmarks/gguf_decode_paths.py [--tokens 32] [--repeats 3] [--threads 1]
        [--cpu-time] [--formats q4_0,q4_1,q8_0,q4_k,q5_k,q6_k,bf16,f16]

Prints tokens/s per path and run, and each path's ratio to the fastest path of the same run
(median, range): issue #24 asks for >= 0.9x.

``--formats`` runs, instead, one group per weight format: the embedded model's matrices
re-encoded into that format (``gguf.quants.quantize`` from the bf16 copy's values), each
format timed on its own paths, alternated, and compared with the fastest path of that same
file (issue #24: "bf16 and quantized paths each >= 0.9x the fastest path of the same model"):

* ``blocks``: the default, the file's block bytes (compiled decoder layer);
* ``per-op``: the same bytes, one ``quant_linear`` call per projection;
* ``fp32``: the same values dequantised once to fp32 (exact), the float model's kernels.

``gguf`` cannot quantise the K-quants (``NotImplementedError``), and they need rows of a
multiple of 256 weights, which only ``down_proj`` (1536) has in this model (576 wide). For
``q4_k``/``q5_k``/``q6_k`` the down projections are valid K-quant rows of random values
(``deepinfer_kernels.testing.quant.random_quant_rows``: the bytes a quantiser writes, not this
model's weights) and the other matrices Q8_0, as llama.cpp falls back for rows it cannot
K-quantise: the tokens are meaningless, the time per token is the format's.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from deepinfer_kernels.quant import QuantType, QuantWeight, dequantize
from deepinfer_kernels.testing.quant import random_quant_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "deepinfer"))


def main() -> int:
    from deepinfer.models import build_model, default_model_path, load_hf_dir, load_model
    from deepinfer.models.convert import convert_gguf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="rate per CPU second of the calling thread (time.thread_time), not wall time: "
        "with --threads 1 it is far less sensitive to other processes on a loaded machine",
    )
    parser.add_argument(
        "--formats",
        default="",
        help="comma-separated weight formats to re-encode the model into and time on their "
        f"own paths ({','.join(FORMATS)}); default: the four paths above",
    )
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if unknown := [f for f in formats if f not in FORMATS]:
        parser.error(f"--formats: unknown {unknown}; known: {','.join(FORMATS)}")
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time: needs --threads 1 (it counts the calling thread only)")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    source = default_model_path()
    bf16_dir = convert_gguf(source)
    config, state = load_hf_dir(bf16_dir)
    prompt = load_model(source).tokenizer.encode("def reverse(s):\n    ")
    if formats:
        for fmt in formats:
            models = format_paths(config, state, fmt)
            rates = time_paths(models, prompt, args.tokens, args.repeats, clock)
            report(rates, args.repeats, args.cpu_time, prefix=f"{fmt}-")
            del models
        return 0
    per_op = load_model(source).model
    per_op.use_cpu_kernels(dataclasses.replace(per_op.cpu_kernels, quant_layer=None))
    models = {
        "gguf-blocks": load_model(source).model,
        "gguf-per-op": per_op,
        # The bf16 checkpoint run in fp32 from its own bf16 tensors (the default since #24).
        "bf16-own": load_model(bf16_dir).model,
        # The same bf16 checkpoint widened to fp32 (the previous default: fp32 weights,
        # bf16 panels for the compiled decoder layer, MKL-packed copies).
        "bf16-widened": build_model(config, state, dtype=torch.float32),
    }
    del state
    rates = time_paths(models, prompt, args.tokens, args.repeats, clock)
    report(rates, args.repeats, args.cpu_time)
    # The bf16 checkpoint's default path against its other exact path (#24: >= 0.9x).
    own = [a / b for a, b in zip(rates["bf16-own"], rates["bf16-widened"], strict=True)]
    print(f"bf16-own / bf16-widened: {statistics.median(own):.2f}x "
          f"({min(own):.2f}-{max(own):.2f})")  # fmt: skip
    return 0


def time_paths(
    models: dict[str, torch.nn.Module], prompt: list[int], tokens: int, repeats: int, clock: Any
) -> dict[str, list[float]]:
    """Tokens per second of each model's greedy decode, runs alternated; the order rotates
    each repeat so no path always follows the same one (the one before leaves the cache)."""
    from model_helpers import greedy_paged

    rates: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        greedy_paged(model, prompt, 4)  # warm: kernels built, weights touched
    names = list(models)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = clock()
            greedy_paged(models[name], prompt, tokens)
            rates[name].append(tokens / (clock() - start))
    return rates


def report(rates: dict[str, list[float]], repeats: int, cpu_time: bool, prefix: str = "") -> None:
    unit = "tok/CPU-s" if cpu_time else "tok/s"
    for name, values in rates.items():
        print(f"{prefix + name:14s} {unit}: " + ", ".join(f"{v:.1f}" for v in values))
    # Each path against the fastest path of the same run (the ">= 0.9x the fastest").
    for name in rates:
        ratios = [rates[name][r] / max(v[r] for v in rates.values()) for r in range(repeats)]
        print(f"{prefix + name:14s} / fastest of its run: {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip


# --formats: name -> the gguf type of the matrices (K-quants: of the down projections only).
FORMATS = {
    "q4_0": QuantType.Q4_0,
    "q4_1": QuantType.Q4_1,
    "q8_0": QuantType.Q8_0,
    "q4_k": QuantType.Q4_K,
    "q5_k": QuantType.Q5_K,
    "q6_k": QuantType.Q6_K,
    "bf16": QuantType.BF16,
    "f16": QuantType.F16,
}
K_QUANTS = (QuantType.Q4_K, QuantType.Q5_K, QuantType.Q6_K)


def encode(values: torch.Tensor, qtype: QuantType, seed: int) -> QuantWeight:
    """``values`` (fp32 [rows, cols]) as ``qtype`` rows: ``gguf.quants.quantize``, or for a
    K-quant random valid rows of the same shape (gguf cannot quantise K-quants)."""
    from gguf import GGMLQuantizationType, quants

    rows, cols = values.shape
    if qtype in K_QUANTS:
        data = random_quant_rows(qtype, rows, cols, seed=seed)
    else:
        raw = quants.quantize(values.numpy(), GGMLQuantizationType(int(qtype)))
        data = torch.from_numpy(raw.view("uint8").reshape(rows, -1).copy())
    return QuantWeight(data, qtype, cols)


def format_paths(
    config: Any, state: dict[str, torch.Tensor], fmt: str
) -> dict[str, torch.nn.Module]:
    """The paths of one re-encoded file: its blocks (compiled layer), per op, and fp32."""
    from deepinfer.models import build_model
    from deepinfer.models.gguf_model import build_gguf_model

    qtype = FORMATS[fmt]

    def blocks_and_floats() -> tuple[dict[str, torch.Tensor], dict[str, QuantWeight]]:
        floats, blocks = {}, {}
        for i, (name, tensor) in enumerate(sorted(state.items())):
            if tensor.dim() != 2 or not name.endswith(".weight"):
                floats[name] = tensor.float()
                continue
            kind = qtype
            if qtype in K_QUANTS and ("down_proj" not in name or tensor.shape[1] % 256):
                kind = QuantType.Q8_0  # llama.cpp's fallback for rows it cannot K-quantise
            blocks[name] = encode(tensor.float(), kind, seed=i)
        if config.tie_word_embeddings:
            blocks.pop("lm_head.weight", None)
        return floats, blocks

    floats, blocks = blocks_and_floats()
    # fp32: the very values the blocks hold, dequantised once (bit-identical to gguf's).
    fp32_state = dict(floats)
    fp32_state.update({name: dequantize(w) for name, w in blocks.items()})
    per_op = build_gguf_model(config, *blocks_and_floats())
    per_op.use_cpu_kernels(dataclasses.replace(per_op.cpu_kernels, quant_layer=None))
    return {
        "blocks": build_gguf_model(config, floats, blocks),
        "per-op": per_op,
        "fp32": build_model(config, fp32_state, dtype=torch.float32),
    }


if __name__ == "__main__":
    sys.exit(main())
