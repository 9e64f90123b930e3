"""CPU kernels written in C, compiled with the machine's compiler on first use and cached.

:mod:`deepinfer_kernels.cpu.native` builds and loads them (``DEEPINFER_CPU_KERNELS=0`` turns
them off; without a compiler they report themselves unavailable and the torch paths run).
"""

from deepinfer_kernels.cpu.attention import BoundTiles, PagedAttentionTiles
from deepinfer_kernels.cpu.native import (
    NativeBuildError,
    NativeFunction,
    build_library,
    compiler_available,
    default_cache_dir,
    find_compiler,
    source_digest,
)

__all__ = [
    "BoundTiles",
    "NativeBuildError",
    "NativeFunction",
    "PagedAttentionTiles",
    "build_library",
    "compiler_available",
    "default_cache_dir",
    "find_compiler",
    "source_digest",
]
