"""The compiled CPU kernels a :class:`~deepinfer.models.LlamaModel` can run on, as one bundle.

Each is built with the machine's C compiler on first use and cached
(:mod:`deepinfer_kernels.cpu.native`); each applies only to the operands it was written for
(fp32 CPU rows, autograd off) and the model keeps its torch ops for everything else, including
when a kernel cannot be built (no compiler: one warning) or ``DEEPINFER_CPU_KERNELS=0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deepinfer_kernels.cpu.add_rms_norm import AddRmsNorm
from deepinfer_kernels.cpu.attention import PagedAttentionTiles
from deepinfer_kernels.cpu.bf16_weight_linear import Bf16WeightLinear
from deepinfer_kernels.cpu.decoder_layer import DecoderLayerKernel
from deepinfer_kernels.cpu.quant_decoder_layer import QuantDecoderLayerKernel


@dataclass
class CpuKernels:
    """``None`` fields keep the torch op.

    * ``linear``: few-row products of bf16-exact weights (bf16 panels, fp32 arithmetic);
    * ``norm``: residual add + RMSNorm;
    * ``attention``: short paged-attention tiles (decode, verification);
    * ``layer``: a decoder layer minus its attention as two calls, for steps of up to
      ``BF16_MAX_ROWS`` rows when every projection weight is bf16-exact;
    * ``quant_layer``: the same two calls over weights kept in GGUF block formats (or a bf16
      checkpoint's own bf16 tensors), for steps of up to ``BF16_MAX_ROWS`` rows.
    """

    linear: Bf16WeightLinear | None = None
    norm: AddRmsNorm | None = None
    attention: PagedAttentionTiles | None = None
    layer: DecoderLayerKernel | None = None
    quant_layer: QuantDecoderLayerKernel | None = None

    @classmethod
    def all(cls, cache_dir: Path | None = None, enabled: bool | None = None) -> CpuKernels:
        """Every kernel (``enabled=None`` reads ``DEEPINFER_CPU_KERNELS``)."""
        return cls(
            linear=Bf16WeightLinear(cache_dir, enabled),
            norm=AddRmsNorm(cache_dir, enabled),
            attention=PagedAttentionTiles(cache_dir, enabled),
            layer=DecoderLayerKernel(cache_dir, enabled),
            quant_layer=QuantDecoderLayerKernel(cache_dir, enabled),
        )
