"""Building a :class:`DSparkSpeculator` for an engine: drafter checkpoint, STS, SPS profile.

``speculative`` as accepted by ``LLM(..., speculative=...)``:

* ``None`` (the default): no speculation;
* ``"dspark"``: the drafter shipped in ``deepinfer/data/dspark-smollm2`` (trained for the
  embedded SmolLM2-135M-Instruct; a model with another hidden size or vocabulary is refused);
* a path: a ``deepinfer-spec`` checkpoint directory (``drafter.safetensors`` + ``config.json``,
  optionally ``sts.json`` with calibration temperatures);
* a :class:`~deepinfer_spec.SpeculativeConfig`: one of the two above plus how many
  drafts to verify (DSpark's scheduler or a fixed count) and whether the draft gate runs;
* a :class:`~deepinfer_spec.DSparkDrafter`, or a ready :class:`DSparkSpeculator`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer.models.spec_adapter import LlamaTargetAdapter
from deepinfer.speculative.speculator import DSparkSpeculator
from deepinfer_kernels.cpu import ModuleLinear
from deepinfer_kernels.cpu.dspark_draft import DSparkDraftKernel
from deepinfer_kernels.quant.formats import QuantType, QuantWeight
from deepinfer_spec import (
    DraftGate,
    DSparkDrafter,
    SpeculativeConfig,
    SPSCurve,
    VerifyScheduler,
    load_speculator,
    profile_target,
)
from deepinfer_spec.native_draft import native_draft_kernel

SHIPPED_DRAFTER = Path(__file__).resolve().parents[1] / "data" / "dspark-smollm2"

SpeculativeSpec = (
    str | os.PathLike[str] | SpeculativeConfig | DSparkDrafter | DSparkSpeculator | None
)


def profile_target_sps(
    model: LlamaModel,
    pool: KVPool,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    *,
    context: int = 64,
    repeats: int = 2,
    warmup: int = 1,
) -> SPSCurve:
    """`deepinfer_spec.profile_target` over ``model`` on ``pool``: real target forwards of ``B``
    new tokens over a ``context``-token paged history, in free blocks of ``pool`` borrowed for
    the duration (the K/V written there is scratch)."""
    need = -(-(context + max(batch_sizes, default=0)) // pool.block_size)
    if need > pool.num_free_blocks:
        raise ValueError(f"pool: profiling needs {need} free blocks, {pool.num_free_blocks} free")
    sync = torch.cuda.synchronize if model.norm.weight.device.type == "cuda" else None
    target = LlamaTargetAdapter(model, pool)
    # Inference mode, as the engine's own forwards: a buffer the model made inside it cannot be
    # updated outside it, so a profile taken after engine steps would fail otherwise.
    with torch.inference_mode():
        return profile_target(
            target, batch_sizes, context=context, repeats=repeats, warmup=warmup, synchronize=sync
        )


def build_speculator(
    speculative: SpeculativeSpec,
    model: LlamaModel,
    pool: KVPool,
    *,
    max_seqs: int,
    scheduler: VerifyScheduler | None = None,
    gate: DraftGate | str | None = "default",
) -> DSparkSpeculator | None:
    """Turn ``LLM(speculative=...)`` into a speculator for ``model`` (see module docstring).

    ``scheduler`` and ``gate`` as in :func:`deepinfer_spec.choose_policy`, over target step
    times profiled now on ``model`` (:func:`profile_target_sps`); a CPU drafter still on its
    modules' own products (MKL) moves to the model's few-row products
    (:class:`~deepinfer_kernels.cpu.module_linear.ModuleLinear`, bf16 panels of a bf16
    checkpoint's exact values) when they propose faster here; greedy proposals run as one
    compiled call (:func:`native_draft_for`) where it can.
    """
    if speculative is None or isinstance(speculative, DSparkSpeculator):
        return speculative
    num_speculative_tokens = None
    if isinstance(speculative, SpeculativeConfig):
        num_speculative_tokens = speculative.num_speculative_tokens
        gate = gate if speculative.draft_gate else None
        speculative = speculative.model
    directory = SHIPPED_DRAFTER if speculative == "dspark" else speculative
    weight = model.norm.weight  # the model's float dtype (a GGUF table holds bytes)

    def profile(sizes: Sequence[int]) -> SPSCurve | None:
        # Time over as much history as the free blocks hold, up to 64 tokens; none: no curve.
        room = pool.num_free_blocks * pool.block_size - max(sizes)
        return profile_target_sps(model, pool, sizes, context=min(64, room)) if room >= 1 else None

    try:
        spec = load_speculator(
            directory,
            LlamaTargetAdapter(model, pool),
            profile,
            max_seqs=max_seqs,
            device=weight.device,
            dtype=weight.dtype,
            scheduler=scheduler,
            num_speculative_tokens=num_speculative_tokens,
            gate=gate,
            linears=[ModuleLinear(model.cpu_kernels.linear)],
            native=lambda drafter: native_draft_for(drafter, model),
        )
    except ValueError as exc:
        raise ValueError(f"speculative: {exc}") from exc
    return DSparkSpeculator.over(spec)


def native_draft_for(drafter: DSparkDrafter, model: LlamaModel) -> DSparkDraftKernel | None:
    """The drafter's greedy block as one compiled call (``deepinfer_spec.native_draft``) over
    ``model``'s own head rows of the draft vocabulary (a GGUF head keeps its block format, a
    dense one its fp32 values) and final norm; ``None`` where it cannot run (not a CPU model,
    weights that are not bf16 values, no compiler, ``DEEPINFER_CPU_KERNELS=0``)."""
    if model.norm.weight.device.type != "cpu":
        return None
    ids = drafter.draft_vocab_ids
    index = torch.arange(drafter.vocab_size) if ids is None else ids.cpu()
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    table = getattr(head, "table", None)
    if table is not None:  # a head kept in a GGUF block format (deepinfer.models.quant_layers)
        rows = table().select_rows(index)
    else:
        dense = model.lm_head_weight.detach()[index].float().contiguous()
        rows = QuantWeight(dense.view(torch.uint8), QuantType.F32, int(dense.shape[1]))
    return native_draft_kernel(drafter, rows, model.norm.weight, model.norm.eps)
