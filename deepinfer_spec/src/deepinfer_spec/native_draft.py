"""The drafter's greedy block as one compiled call: :func:`native_draft_kernel`.

A greedy proposal through the torch modules is ~80 torch ops and a dozen foreign product
calls; on a CPU their dispatch cost about as much as the arithmetic of their few-row
products. ``deepinfer_kernels.cpu.dspark_draft`` runs the whole proposal (backbone, the
target's head rows, the Markov step, the confidences) and the projection of new positions into
context entries as one call each. This module hands it the drafter's weights;
:meth:`DSparkDrafter.use_native <deepinfer_spec.drafter.DSparkDrafter.use_native>` then makes
``propose`` take it for greedy rows without a logits hook, and ``LazyContext`` for the
drafter's context entries. Sampled rows, hooked rows (grammar masks) and training keep the
modules.

Example (an engine on a GGUF target, whose head rows are its own block rows)::

    kernel = native_draft_kernel(drafter, head_rows, final_norm.weight, final_norm.eps)
    if kernel is not None:
        drafter.use_native(kernel)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from deepinfer_kernels.cpu.dspark_draft import (
    DraftBlockWeights,
    DraftContextWeights,
    DraftLayerWeights,
    DSparkDraftKernel,
)
from deepinfer_kernels.quant.formats import QuantWeight
from deepinfer_spec.drafter import DSparkDrafter
from deepinfer_spec.layers import DraftLayer


def native_draft_kernel(
    drafter: DSparkDrafter,
    head_rows: QuantWeight,
    head_norm: torch.Tensor,
    head_eps: float,
    *,
    enabled: bool | None = None,
) -> DSparkDraftKernel | None:
    """The compiled proposal for ``drafter``, or ``None`` where it cannot run here.

    ``head_rows``: the target's LM-head rows of the drafter's draft vocabulary (all rows
    without one), in the target's own format; ``head_norm``/``head_eps``: the target's final
    RMSNorm. ``None`` when the drafter is not on the CPU, uses the ``"rnn"`` sequential head,
    has weights that are not exactly bf16 values (a bf16 checkpoint's are), or the kernel
    cannot be built (no C compiler, ``DEEPINFER_CPU_KERNELS=0``).
    """
    if not isinstance(drafter, DSparkDrafter):
        raise TypeError(f"drafter: expected DSparkDrafter, got {type(drafter).__name__}")
    rows = drafter.draft_vocab_size
    if head_rows.rows != rows or head_rows.cols != drafter.hidden_size:
        raise ValueError(
            f"head_rows: expected [{rows}, {drafter.hidden_size}] (one row per draftable id), "
            f"got {list(head_rows.shape)}"
        )
    weight = drafter.context_proj.weight
    if weight.device.type != "cpu" or head_rows.data.device.type != "cpu":
        return None
    if drafter.config.sequential_head != "markov":
        return None
    config = drafter.config
    layers = cast(Sequence[DraftLayer], drafter.layers)
    block_layers = tuple(
        DraftLayerWeights(
            input_norm=layer.input_layernorm.weight,
            qkv=torch.cat((layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight)),
            o=layer.o_proj.weight,
            post_norm=layer.post_attention_layernorm.weight,
            gate_up=torch.cat((layer.gate_proj.weight, layer.up_proj.weight)),
            down=layer.down_proj.weight,
        )
        for layer in layers
    )
    conf = drafter.confidence_head
    with torch.no_grad():
        block = DraftBlockWeights(
            mask_embed=drafter.mask_embed.detach().float(),
            layers=block_layers,
            num_heads=config.num_heads,
            num_kv_heads=config.kv_heads,
            eps=config.rms_norm_eps,
            rope_cos=drafter.rope_cos,
            rope_sin=drafter.rope_sin,
            head_norm=head_norm.detach().float(),
            head_eps=float(head_eps),
            head_rows=head_rows,
            markov_in=drafter.markov_in.weight.detach().float(),
            markov_out=drafter.markov_out.weight,
            vocab_ids=drafter.draft_vocab_ids,
            conf_w=conf.weight.detach().float()[0],
            conf_b=float(conf.bias.detach()[0]) if conf.bias is not None else 0.0,
        )
        context = DraftContextWeights(
            shift=drafter.feature_shift.float(),
            scale=drafter.feature_scale.float(),
            proj=drafter.context_proj.weight,
            norm=drafter.context_norm.weight.detach().float(),
            eps=drafter.context_norm.eps,
            kv=torch.cat(
                [w for layer in layers for w in (layer.k_proj.weight, layer.v_proj.weight)]
            ),
        )
        try:
            kernel = DSparkDraftKernel(block, context, enabled=enabled)
        except ValueError:  # weights that are not bf16 values: the panels would round them
            return None
    return kernel if kernel.available() else None
