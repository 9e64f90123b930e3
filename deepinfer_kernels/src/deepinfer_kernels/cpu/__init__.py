"""CPU kernels written in C, built ahead of time (``make kernels``) or on first use, and cached.

Each op has a torch reference (:mod:`deepinfer_kernels.reference.cpu`) and a ``torch.library``
registration with a fake (:mod:`deepinfer_kernels.cpu.ops`); each applies to the operands it
was written for (fp32 CPU rows, autograd off) and its callers keep torch ops for the rest.
:mod:`deepinfer_kernels.cpu.native` loads them (``DEEPINFER_CPU_KERNELS=0`` turns them off;
without a compiler they report themselves unavailable, with one warning per process, and the
torch paths run); :mod:`deepinfer_kernels.cpu.sources` declares every C signature once.

Example::

    import torch
    from deepinfer_kernels.cpu import CpuKernels, add_rms_norm  # registers the torch ops too

    kernels = CpuKernels.all()  # handles; each builds on first use
    with torch.no_grad():
        r, n = add_rms_norm(torch.randn(2, 64), torch.randn(2, 64), torch.ones(64), 1e-5,
                            kernels.norm)
"""

import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from deepinfer_kernels.cpu.numpy_blocks import BlockRows, LayerBlockRows, LayerDims
    from deepinfer_kernels.cpu.numpy_ops import NumpyKernels
    from deepinfer_kernels.cpu.openmp import load_openmp_runtime, set_num_threads
    from deepinfer_kernels.cpu.quant_decoder_layer import (
        BlockMatrix,
        LayerBlocks,
        QuantDecoderLayerKernel,
    )
    from deepinfer_kernels.cpu.sources import ALL_SOURCES

# PEP 562 lazy re-exports: importing this package loads no torch, so a torch-free process (the
# lean runtime, ``deepinfer_kernels.cpu.numpy_ops``) can use the C kernels. {name: module}.
_EXPORTS = {
    "CSignature": "abi",
    "CSource": "abi",
    "NativeAbiError": "abi",
    "AddRmsNorm": "add_rms_norm",
    "add_rms_norm": "add_rms_norm",
    "rms_norm": "add_rms_norm",
    "BoundTiles": "attention",
    "PagedAttentionTiles": "attention",
    "PANEL": "bf16_weight_linear",
    "Bf16WeightLinear": "bf16_weight_linear",
    "bf16_panels": "bf16_weight_linear",
    "unpack_panels": "bf16_weight_linear",
    "BoundLayers": "bound_layers",
    "DecodeTiles": "decode_tiles",
    "plan_decode_tiles": "decode_tiles",
    "plan_verify_tile": "decode_tiles",
    "DecoderBlocks": "decoder_blocks",
    "block_matrix_of": "decoder_blocks",
    "DecoderLayerKernel": "decoder_layer",
    "FusedLayerKernel": "decoder_layer",
    "LayerPanels": "decoder_layer",
    "LayerShape": "decoder_layer",
    "SlotMapping": "decoder_layer",
    "DecoderPanels": "decoder_panels",
    "LayerProjections": "decoder_panels",
    "LayerWeightCache": "decoder_panels",
    "Projection": "decoder_panels",
    "CpuKernels": "kernels",
    "BF16_MAX_ROWS": "linear",
    "PackedWeight": "linear",
    "linear": "linear",
    "mkl_packing_available": "linear",
    "ModuleLinear": "module_linear",
    "CompileError": "native",
    "NativeBuildError": "native",
    "NativeFunction": "native",
    "build_library": "native",
    "build_prebuilt": "native",
    "compiler_available": "native",
    "default_cache_dir": "native",
    "exclusive_lock": "native",
    "find_compiler": "native",
    "load_library": "native",
    "source_digest": "native",
    "BlockMatrix": "quant_decoder_layer",
    "LayerBlocks": "quant_decoder_layer",
    "QuantDecoderLayerKernel": "quant_decoder_layer",
    "ALL_SOURCES": "sources",
    "BlockRows": "numpy_blocks",
    "LayerBlockRows": "numpy_blocks",
    "LayerDims": "numpy_blocks",
    "NumpyKernels": "numpy_ops",
    "load_openmp_runtime": "openmp",
    "set_num_threads": "openmp",
}
# Modules that import no torch; every other export is a torch path, whose ops register first.
_TORCH_FREE = frozenset({"abi", "native", "numpy_blocks", "numpy_ops", "openmp", "sources"})


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name in ("ops", "quant_layer_ops"):
            return import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module not in _TORCH_FREE:
        # The torch.library ops (torch.ops.deepinfer.*) register with the first torch export,
        # as the eager package registered them on import.
        import_module(f"{__name__}.ops")
        import_module(f"{__name__}.quant_layer_ops")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# Two exports share their module's name (``add_rms_norm``, ``linear``). Importing such a
# submodule binds the module to the package attribute of that name (the import system does so
# once the submodule has run); the eager package re-bound the function right after, and this
# class keeps doing so whichever code imports the submodule first.
_SHADOWED = frozenset({"add_rms_norm", "linear"})


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "set_num_threads",
    "load_openmp_runtime",
    "NumpyKernels",
    "LayerDims",
    "LayerBlockRows",
    "BlockRows",
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
