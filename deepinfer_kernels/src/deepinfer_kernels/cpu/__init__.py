"""CPU kernels written in C, built ahead of time (``make kernels``) or on first use, and cached.

Each op has a torch reference (:mod:`deepinfer_kernels.reference.cpu`) and a ``torch.library``
registration with a fake (:mod:`deepinfer_kernels.cpu.ops`); each applies to the operands it
was written for (fp32 CPU rows, autograd off) and its callers keep torch ops for the rest.
:mod:`deepinfer_kernels.cpu.native` loads them (``DEEPINFER_CPU_KERNELS=0`` turns them off;
without a compiler they report themselves unavailable, with one warning per process, and the
torch paths run); :mod:`deepinfer_kernels.cpu.sources` declares every C signature once.

Example::

    import torch
    from deepinfer_kernels.cpu import CpuKernels, add_rms_norm

    kernels = CpuKernels.all()  # handles; each builds on first use
    with torch.no_grad():
        r, n = add_rms_norm(torch.randn(2, 64), torch.randn(2, 64), torch.ones(64), 1e-5,
                            kernels.norm)
"""

# Registers the torch.library ops (torch.ops.deepinfer.*), as attention/ops.py does.
from deepinfer_kernels.cpu import ops as ops
from deepinfer_kernels.cpu import quant_layer_ops as quant_layer_ops
from deepinfer_kernels.cpu.abi import CSignature, CSource, NativeAbiError
from deepinfer_kernels.cpu.add_rms_norm import AddRmsNorm, add_rms_norm, rms_norm
from deepinfer_kernels.cpu.attention import BoundTiles, PagedAttentionTiles
from deepinfer_kernels.cpu.bf16_weight_linear import (
    PANEL,
    Bf16WeightLinear,
    bf16_panels,
    unpack_panels,
)
from deepinfer_kernels.cpu.bound_layers import BoundLayers
from deepinfer_kernels.cpu.decode_tiles import DecodeTiles, plan_decode_tiles, plan_verify_tile
from deepinfer_kernels.cpu.decoder_blocks import DecoderBlocks, block_matrix_of
from deepinfer_kernels.cpu.decoder_layer import (
    DecoderLayerKernel,
    FusedLayerKernel,
    LayerPanels,
    LayerShape,
    SlotMapping,
)
from deepinfer_kernels.cpu.decoder_panels import (
    DecoderPanels,
    LayerProjections,
    LayerWeightCache,
    Projection,
)
from deepinfer_kernels.cpu.kernels import CpuKernels
from deepinfer_kernels.cpu.linear import (
    BF16_MAX_ROWS,
    PackedWeight,
    linear,
    mkl_packing_available,
)
from deepinfer_kernels.cpu.module_linear import ModuleLinear
from deepinfer_kernels.cpu.native import (
    CompileError,
    NativeBuildError,
    NativeFunction,
    build_library,
    build_prebuilt,
    compiler_available,
    default_cache_dir,
    exclusive_lock,
    find_compiler,
    load_library,
    source_digest,
)
from deepinfer_kernels.cpu.quant_decoder_layer import (
    BlockMatrix,
    LayerBlocks,
    QuantDecoderLayerKernel,
)
from deepinfer_kernels.cpu.sources import ALL_SOURCES

__all__ = [
    "ALL_SOURCES",
    "BF16_MAX_ROWS",
    "PANEL",
    "AddRmsNorm",
    "Bf16WeightLinear",
    "BlockMatrix",
    "BoundLayers",
    "BoundTiles",
    "CSignature",
    "CSource",
    "CompileError",
    "CpuKernels",
    "DecodeTiles",
    "DecoderBlocks",
    "DecoderLayerKernel",
    "DecoderPanels",
    "FusedLayerKernel",
    "LayerBlocks",
    "LayerPanels",
    "LayerProjections",
    "LayerShape",
    "LayerWeightCache",
    "ModuleLinear",
    "NativeAbiError",
    "NativeBuildError",
    "NativeFunction",
    "PackedWeight",
    "PagedAttentionTiles",
    "Projection",
    "QuantDecoderLayerKernel",
    "SlotMapping",
    "add_rms_norm",
    "bf16_panels",
    "block_matrix_of",
    "build_library",
    "build_prebuilt",
    "compiler_available",
    "default_cache_dir",
    "exclusive_lock",
    "find_compiler",
    "linear",
    "load_library",
    "mkl_packing_available",
    "plan_decode_tiles",
    "plan_verify_tile",
    "rms_norm",
    "source_digest",
    "unpack_panels",
]
