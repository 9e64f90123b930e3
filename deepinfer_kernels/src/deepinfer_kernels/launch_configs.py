"""The launch configurations of every Triton kernel, in one table (#23 item 1).

Each wrapper asks this module for its tiles, ``num_warps`` and ``num_stages``;
:mod:`deepinfer_kernels.gpu_readiness` enumerates :func:`readiness_cases` (the same functions
evaluated at the shapes that select each configuration) and compiles them for sm_90, so a tile
change that makes a kernel spill registers fails a CPU test instead of a first GPU run.

Under the Triton interpreter (CPU tests) every kernel takes small tiles: programs run one
after another in Python and the interpreter's cost grows with the tile, not the grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepinfer_kernels._dispatch import interpreter_active


def _next_pow2(n: int, at_least: int = 1) -> int:
    return max(at_least, 1 << max(0, int(n) - 1).bit_length())


def _interpreting(interpret: bool | None) -> bool:
    """``interpret`` when given (the readiness table asks for GPU tiles from any process),
    else whether the Triton interpreter is on."""
    return interpreter_active() if interpret is None else interpret


@dataclass(frozen=True)
class Launch:
    """Tile constexprs plus the launch options of one kernel configuration."""

    tiles: dict[str, int]
    num_warps: int
    num_stages: int

    def __getitem__(self, name: str) -> int:
        return self.tiles[name]


# --- paged attention: the unified kernel ---------------------------------------------------


def unified_is_decode(total_q: int, batch: int) -> bool:
    """Decode-heavy batch: at most two query rows per sequence on average (decode, or a short
    verification); the tiles then follow vLLM's BLOCK_M 16 for decode."""
    return total_q <= 2 * max(batch, 1)


def unified_launch(
    total_q: int, batch: int, group: int, head_dim: int, fp32: bool, interpret: bool | None = None
) -> Launch:
    """``G_PAD``, ``BLOCK_Q``, ``BLOCK_N`` and launch options of ``_unified_attention_kernel``.

    The M tile stacks ``BLOCK_Q`` tokens times the padded GQA group. Decode uses M = 16 (one
    MMA row block: a single query times up to 16 heads); prefill uses M = 128 (64 for head dims
    above 128) so each K/V tile is reused across many queries. fp32 operands have no tensor-core
    path and take twice the registers, so fp32 uses M = 16 / 32 and N = 16 / 32.
    """
    g_pad = _next_pow2(group)
    d_pad = _next_pow2(head_dim, 16)
    if _interpreting(interpret):
        return Launch({"G_PAD": g_pad, "BLOCK_Q": max(1, 16 // g_pad), "BLOCK_N": 16}, 4, 1)
    decode = unified_is_decode(total_q, batch)
    if fp32:
        # fp32 dots run on FMA units with operands in registers: half-size tiles and 8 warps
        # for prefill (measured: 64 x 128 with 32 keys spilled 1.4 KB per thread on 4 warps).
        block_m = 16 if decode else 32
        block_n = 32 if not decode and d_pad <= 128 else 16
        warps = 4 if decode else 8
    else:
        block_m = 16 if decode else (128 if d_pad <= 128 else 64)
        block_n = 64 if d_pad <= 128 else 32
        # Big accumulators (128 x 128 or 64 x 256 fp32) need 8 warps to stay in registers.
        warps = 8 if block_m * d_pad >= 128 * 128 else 4
    block_m = max(block_m, g_pad)
    stages = 2 if d_pad > 128 else 3
    return Launch({"G_PAD": g_pad, "BLOCK_Q": block_m // g_pad, "BLOCK_N": block_n}, warps, stages)


# --- paged attention: split-K decode -----------------------------------------------------


def decode_split_launch(
    group: int, head_dim: int, fp32: bool, interpret: bool | None = None
) -> Launch:
    """``BLOCK_H`` (the GQA group padded to one 16-row MMA block) and ``BLOCK_N`` of
    ``_decode_split_kernel``. Each program reads one chunk of keys; a narrow N tile keeps the
    gathered K/V tiles and their addresses in registers (64 keys at D <= 128 spilled in bf16)."""
    block_h = _next_pow2(group, 16)
    if _interpreting(interpret):
        return Launch({"BLOCK_H": block_h, "BLOCK_N": 16}, 4, 1)
    d_pad = _next_pow2(head_dim, 16)
    block_n = 32 if d_pad <= 128 else 16
    if fp32:
        block_n = 16
    return Launch({"BLOCK_H": block_h, "BLOCK_N": block_n}, 4, 2)


# The split counts the decode kernel is compiled for: NUM_SPLITS is a constexpr, so each count
# is one more compiled kernel; the plan and the wrapper round their choice down to this set.
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32)


# --- MLA, MoE, sampling ------------------------------------------------------------------


def mla_launch(fp32: bool, interpret: bool | None = None) -> Launch:
    """``BLOCK_H`` / ``BLOCK_N`` of ``_mla_split_kernel``: a [16, 512] fp32 accumulator plus
    a [BLOCK_N, 512] latent tile; 8 warps keep both in registers."""
    if _interpreting(interpret):
        return Launch({"BLOCK_H": 16, "BLOCK_N": 16}, 4, 1)
    return Launch({"BLOCK_H": 16, "BLOCK_N": 16 if fp32 else 32}, 8, 2)


def moe_launch(
    num_pairs: int, num_experts: int, fp32: bool, interpret: bool | None = None
) -> Launch:
    """``BLOCK_M`` / ``BLOCK_N`` / ``BLOCK_K`` of the grouped expert GEMMs. Decode batches give
    each expert few rows, where a small M tile wastes less padding."""
    if _interpreting(interpret):
        return Launch({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}, 4, 1)
    block_m = 16 if num_pairs <= 4 * num_experts else 64
    # fp32 gate/up at M = 64 holds two [64, 64] accumulators plus fp32 operands: 8 warps.
    warps = 8 if fp32 and block_m == 64 else 4
    return Launch({"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 32 if fp32 else 64}, warps, 3)


# A guard of the rejection sampler, never reached by a consistent row (every round shrinks a
# finite set): after this many rounds a row takes its argmax, which is always in the kept set.
SAMPLING_MAX_ROUNDS = 256


def sampling_launch(batch: int, vocab: int, on_gpu: bool, interpret: bool | None = None) -> Launch:
    """``BLOCK_B`` rows per program and the ``BLOCK_V`` vocabulary chunk of the sampling and
    verification kernels. On a GPU one program owns one row and streams the vocabulary in
    wide chunks; under the interpreter each program takes many rows (programs run serially)."""
    if on_gpu and not _interpreting(interpret):
        # 8 warps: the rejection sampler's sampling pass holds logits, weights, their running
        # sum and indices for a 4096-wide chunk (24 bytes per thread spilled on 4 warps).
        return Launch({"BLOCK_B": 1, "BLOCK_V": min(_next_pow2(vocab), 4096)}, 8, 1)
    block_b = min(_next_pow2(max(batch, 1)), 4096)
    return Launch({"BLOCK_B": block_b, "BLOCK_V": min(_next_pow2(vocab), 128)}, 4, 1)


# --- the readiness table -----------------------------------------------------------------


@dataclass(frozen=True)
class ReadinessCase:
    """One compiled configuration: the kernel (module and name), operand dtype, constexprs and
    launch options, as the wrapper would launch it. ``quick`` cases are the ones the CPU test
    compiles (the configurations that spilled before, plus one per other kernel family, so
    the test stays within a minute);
    ``python -m deepinfer_kernels.gpu_readiness`` compiles them all."""

    label: str
    module: str
    kernel: str
    dtype: str
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    quick: bool = False
    # Pointer arguments whose element type is not ``dtype`` (index tensors, fp32 partials).
    ptr_types: dict[str, str] = field(default_factory=dict)
    # The JIT marks 16-aligned pointers and integers that are multiples of 16 as such, which
    # lets the compiler vectorise. Pointers and strides (``stride*``, ``s_*``) are assumed
    # aligned except those in ``unaligned``; other integers only when listed in ``aligned``.
    unaligned: tuple[str, ...] = ()
    aligned: tuple[str, ...] = ()
    # Integer arguments that are 1 at a launch (a unit stride): the JIT makes them constants.
    ones: tuple[str, ...] = ()


_ATTN = "deepinfer_kernels.attention"
_ATTN_PTRS = {
    **dict.fromkeys(("block_table_ptr", "seq_lens_ptr", "cu_q_ptr"), "*i32"),
    **dict.fromkeys(("po_ptr", "plse_ptr", "lse_ptr"), "*fp32"),
}
_DTYPES = ("bf16", "fp32")


def _precision(dtype: str) -> str:
    return "ieee" if dtype == "fp32" else "tf32"


def _unified_cases() -> list[ReadinessCase]:
    out = []
    # (mode, total_q, batch) selecting each tile class; Llama-like GQA group 4, 16-token blocks.
    for dtype in _DTYPES:
        for mode, total_q, batch in (("decode", 8, 8), ("extend", 4096, 2)):
            for d in (128, 256):
                launch = unified_launch(total_q, batch, 4, d, dtype == "fp32", interpret=False)
                constexprs = {
                    "HEAD_DIM": d, "D_PAD": d, "BLOCK_SIZE": 16, "GROUP": 4,
                    "G_PAD": launch["G_PAD"], "BLOCK_Q": launch["BLOCK_Q"],
                    "BLOCK_N": launch["BLOCK_N"], "CAUSAL": True, "USE_WINDOW": False,
                    "USE_CAP": False, "PRECISION": _precision(dtype), "UPCAST": False,
                }  # fmt: skip
                m = launch["BLOCK_Q"] * launch["G_PAD"]
                label = (
                    f"unified {mode} {dtype} D={d} M={m} N={launch['BLOCK_N']} "
                    f"w={launch.num_warps} s={launch.num_stages}"
                )
                out.append(
                    ReadinessCase(
                        label, f"{_ATTN}.triton_unified", "_unified_attention_kernel", dtype,
                        constexprs, launch.num_warps, launch.num_stages,
                        quick=d == 128 and (dtype, mode) in (("bf16", "decode"), ("fp32", "extend")),
                        ptr_types=_ATTN_PTRS,
                        unaligned=("stride_bt", "stride_lt"),
                    )
                )  # fmt: skip
    return out


def _decode_cases() -> list[ReadinessCase]:
    out = []
    for dtype in _DTYPES:
        for d in (128, 256):
            launch = decode_split_launch(4, d, dtype == "fp32", interpret=False)
            constexprs = {
                "NUM_SPLITS": 4, "NUM_Q_HEADS": 32, "HEAD_DIM": d, "D_PAD": d,
                "BLOCK_SIZE": 16, "GROUP": 4, "BLOCK_H": launch["BLOCK_H"],
                "BLOCK_N": launch["BLOCK_N"], "USE_WINDOW": False, "USE_CAP": False,
                "PRECISION": _precision(dtype), "UPCAST": False,
            }  # fmt: skip
            label = (
                f"split-K decode {dtype} D={d} H={launch['BLOCK_H']} N={launch['BLOCK_N']} "
                f"w={launch.num_warps} s={launch.num_stages}"
            )
            out.append(
                ReadinessCase(
                    label, f"{_ATTN}.triton_decode", "_decode_split_kernel", dtype, constexprs,
                    launch.num_warps, launch.num_stages, quick=dtype == "fp32" and d == 128,
                    ptr_types=_ATTN_PTRS, unaligned=("stride_bt",),
                )
            )  # fmt: skip
    # The partial merge reads fp32 partials (whatever the output dtype) at the largest count.
    merge = {"NUM_SPLITS": SPLIT_COUNTS[-1], "S_PAD": SPLIT_COUNTS[-1], "HEAD_DIM": 256,
             "D_PAD": 256}  # fmt: skip
    out.append(
        ReadinessCase(
            "split-K merge bf16 D=256 S=32", f"{_ATTN}.triton_decode", "_merge_splits_kernel",
            "bf16", merge, 4, 3, ptr_types=_ATTN_PTRS,
        )
    )  # fmt: skip
    return out


def _mla_cases() -> list[ReadinessCase]:
    out = []
    for dtype in _DTYPES:
        launch = mla_launch(dtype == "fp32", interpret=False)
        constexprs = {
            "NUM_HEADS": 128, "RANK": 512, "R_PAD": 512, "ROPE": 64, "P_PAD": 64,
            "BLOCK_SIZE": 64, "BLOCK_H": launch["BLOCK_H"], "BLOCK_N": launch["BLOCK_N"],
            "NUM_SPLITS": 4, "CAUSAL": True, "PRECISION": _precision(dtype), "UPCAST": False,
        }  # fmt: skip
        out.append(
            ReadinessCase(
                f"MLA decode {dtype} rank=512 rope=64 H=16 N={launch['BLOCK_N']} "
                f"w={launch.num_warps} s={launch.num_stages}",
                "deepinfer_kernels.mla.triton_mla", "_mla_split_kernel", dtype, constexprs,
                launch.num_warps, launch.num_stages,
                ptr_types={
                    **dict.fromkeys(("bt_ptr", "seq_lens_ptr", "cu_ptr", "row_seq_ptr"), "*i32"),
                    **dict.fromkeys(("po_ptr", "plse_ptr"), "*fp32"),
                },
                unaligned=("stride_bt",),
            )
        )  # fmt: skip
    return out


def _moe_cases() -> list[ReadinessCase]:
    out = []
    for dtype in _DTYPES:
        for pairs, phase in ((16, "decode"), (8192, "prefill")):
            launch = moe_launch(pairs, 64, dtype == "fp32", interpret=False)
            tiles = {k: launch[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
            common = {**tiles, "PRECISION": _precision(dtype), "UPCAST": False}
            for kernel, extra, fp32 in (
                ("_gate_up_kernel", {"TOP_K": 2}, {}),
                ("_down_kernel", {}, {"out_ptr": "*fp32", "weights_ptr": "*fp32"}),
            ):
                out.append(
                    ReadinessCase(
                        f"MoE {kernel.strip('_')} {phase} {dtype} M={tiles['BLOCK_M']} "
                        f"N={tiles['BLOCK_N']} K={tiles['BLOCK_K']}",
                        "deepinfer_kernels.moe.triton_moe", kernel, dtype,
                        {**extra, **common}, launch.num_warps, launch.num_stages,
                        quick=phase == "prefill" and dtype == "bf16" and kernel == "_gate_up_kernel",
                        ptr_types={"sorted_ptr": "*i32", "block_expert_ptr": "*i32", **fp32},
                        aligned=("hidden_size", "inter"),
                    )
                )  # fmt: skip
    return out


def _sampling_cases() -> list[ReadinessCase]:
    launch = sampling_launch(64, 128256, on_gpu=True, interpret=False)
    tiles = {
        "BLOCK_B": launch["BLOCK_B"],
        "BLOCK_V": launch["BLOCK_V"],
        "MAX_ROUNDS": SAMPLING_MAX_ROUNDS,
    }
    out = []
    for dtype in ("bf16", "fp32"):
        out.append(
            ReadinessCase(
                f"sample (rejection) {dtype} V=128256 V-tile={tiles['BLOCK_V']}",
                "deepinfer_kernels.sampling.triton_sampling", "_sample_kernel", dtype, tiles,
                launch.num_warps, launch.num_stages, quick=dtype == "bf16",
                ptr_types={
                    **dict.fromkeys(("k_ptr", "out_ptr", "seed_ptr"), "*i64"),
                    "rounds_ptr": "*i32",
                    **dict.fromkeys(("t_ptr", "p_ptr", "mp_ptr", "u_ptr"), "*fp32"),
                },
                unaligned=("s_lg_b",), ones=("s_lg_v",),
            )
        )  # fmt: skip
    return out


def readiness_cases() -> list[ReadinessCase]:
    """Every configuration the wrappers launch on a GPU, per kernel and tile class."""
    return [
        *_unified_cases(),
        *_decode_cases(),
        *_mla_cases(),
        *_moe_cases(),
        *_sampling_cases(),
    ]


__all__ = [
    "SAMPLING_MAX_ROUNDS",
    "SPLIT_COUNTS",
    "Launch",
    "ReadinessCase",
    "decode_split_launch",
    "mla_launch",
    "moe_launch",
    "readiness_cases",
    "sampling_launch",
    "unified_is_decode",
    "unified_launch",
]
