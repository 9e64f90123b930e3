"""Building a :class:`DSparkSpeculator` for an engine: drafter checkpoint, STS, SPS profile.

``speculative`` as accepted by ``LLM(..., speculative=...)``:

* ``None`` (the default): no speculation;
* ``"dspark"``: the drafter shipped in ``deepinfer/data/dspark-smollm2`` (trained for the
  embedded SmolLM2-135M-Instruct; a model with another hidden size or vocabulary is refused);
* a path: a ``deepinfer-spec`` checkpoint directory (``drafter.safetensors`` + ``config.json``,
  optionally ``sts.json`` with calibration temperatures);
* a :class:`~deepinfer.engine.config.SpeculativeConfig`: one of the two above plus how many
  drafts to verify (DSpark's scheduler or a fixed count) and whether the draft gate runs;
* a :class:`~deepinfer_spec.DSparkDrafter`, or a ready :class:`DSparkSpeculator`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from deepinfer.engine.config import SpeculativeConfig
from deepinfer.models.attention_metadata import AttentionMetadata
from deepinfer.models.kv_pool import KVPool
from deepinfer.models.llama import LlamaModel
from deepinfer.models.spec_adapter import LlamaTargetAdapter
from deepinfer.speculative.speculator import DSparkSpeculator
from deepinfer_kernels.cpu import ModuleLinear
from deepinfer_spec import (
    DraftGate,
    DSparkDrafter,
    FixedGammaScheduler,
    PrefixScheduler,
    SPSCurve,
    VerifyScheduler,
    fastest_linear,
    module_linear,
    priced_gate,
    profile_sps,
)
from deepinfer_spec.training import load_drafter, load_sts

SHIPPED_DRAFTER = Path(__file__).resolve().parents[1] / "data" / "dspark-smollm2"

SpeculativeSpec = (
    str | os.PathLike[str] | SpeculativeConfig | DSparkDrafter | DSparkSpeculator | None
)


@torch.no_grad()
def profile_target_sps(
    model: LlamaModel,
    pool: KVPool,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    *,
    context: int = 64,
    repeats: int = 2,
    warmup: int = 1,
) -> SPSCurve:
    """Time real target forwards of ``B`` new tokens over a ``context``-token paged history.

    Borrows free blocks of ``pool`` for the duration and returns them; the K/V it writes there
    is scratch. Cheap by design (``len(batch_sizes) * (repeats + warmup)`` forwards).
    """
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes: expected positive sizes, got {list(batch_sizes)}")
    bs = pool.block_size
    need = -(-(context + sizes[-1]) // bs)
    if need > pool.num_free_blocks:
        raise ValueError(f"pool: profiling needs {need} free blocks, {pool.num_free_blocks} free")
    blocks = pool.allocate(need)
    device = model.embed_tokens.weight.device
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    try:

        def forward(start: int, length: int) -> None:
            attn = AttentionMetadata.build([blocks], [start + length], [length], bs, device=device)
            ids = torch.randint(0, vocab, (length,), generator=gen).to(device)
            pos = torch.arange(start, start + length, device=device)
            with torch.inference_mode():
                hidden = model(ids, pos, attn, pool)
                model.compute_logits(hidden)

        forward(0, context)  # a real history for the timed steps to attend to
        sync = torch.cuda.synchronize if device.type == "cuda" else None
        return profile_sps(lambda b: forward(context, b), sizes, repeats, warmup, synchronize=sync)
    finally:
        pool.free(blocks)


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

    Without ``scheduler`` the prefix scheduler runs over an SPS curve profiled now on ``model``.
    A CPU drafter still on its modules' own products is switched to the model's
    (:class:`~deepinfer_kernels.cpu.module_linear.ModuleLinear`).

    ``gate``: ``"default"`` pauses drafting while it does not pay on this machine
    (:meth:`DraftGate.break_even` over the drafter's measured forward, :func:`time_draft`, and
    the target's profiled step times), ``None`` drafts on every step, or a configured
    :class:`DraftGate`.
    """
    if speculative is None or isinstance(speculative, DSparkSpeculator):
        return speculative
    if isinstance(speculative, SpeculativeConfig):
        if speculative.num_speculative_tokens is not None and scheduler is None:
            scheduler = FixedGammaScheduler(speculative.num_speculative_tokens)
        if not speculative.draft_gate:
            gate = None
        speculative = speculative.model
    sts: dict[str, torch.Tensor] = {}
    if isinstance(speculative, DSparkDrafter):
        drafter = speculative
    else:
        directory = SHIPPED_DRAFTER if speculative == "dspark" else Path(speculative)
        if not (directory / "config.json").exists():
            raise ValueError(
                f"speculative: {os.fspath(directory)!r} is not a drafter checkpoint directory"
            )
        target = LlamaTargetAdapter(model, pool)
        weight = model.norm.weight  # the model's float dtype (a GGUF table holds bytes)
        drafter = load_drafter(directory, target, weight.device).to(weight.dtype)
        sts = load_sts(directory)
    if drafter.linear is module_linear and drafter.context_proj.weight.device.type == "cpu":
        # The model's few-row products (bf16 panels of a bf16 checkpoint's exact values) or the
        # modules' own (MKL), whichever proposes faster here; a LinearFn the caller already
        # chose is kept.
        drafter.use_linear(
            fastest_linear(drafter, [ModuleLinear(model.cpu_kernels.linear), module_linear])
        )
    curve: SPSCurve | None = None
    if scheduler is None:
        curve = profile_target_sps(model, pool)
        scheduler = PrefixScheduler(curve)
    if isinstance(gate, str):
        if gate != "default":
            raise ValueError(f"gate: expected 'default', None or a DraftGate, got {gate!r}")
        room = pool.num_free_blocks * pool.block_size - 2
        if curve is None and room >= 1:
            curve = profile_target_sps(model, pool, (1, 2), context=min(64, room))
        # No free block to time the target with: the unpriced gate.
        gate = DraftGate() if curve is None else priced_gate(drafter, scheduler, curve)
    return DSparkSpeculator(
        drafter,
        scheduler,
        max_seqs=max_seqs,
        sts_greedy=sts.get("greedy"),
        sts_sampling=sts.get("sampling"),
        gate=gate,
    )
