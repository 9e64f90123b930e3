"""Every C kernel of this package and its functions' signatures: the one table.

Each entry's ABI string must equal what its C file's ``deepinfer_abi_<stem>()`` returns
(:meth:`~deepinfer_kernels.cpu.abi.CSource.check` runs on every load); bump ``version`` here
and in the C file together when a signature or an argument's meaning changes.
"""

from __future__ import annotations

from pathlib import Path

from deepinfer_kernels.cpu.abi import CSignature, CSource

CSRC = Path(__file__).parent / "csrc"

ADD_RMS_NORM = CSource(
    CSRC / "add_rms_norm.c",
    1,
    # residual, delta, weight, residual_out, out, M, H, eps
    (CSignature("deepinfer_add_rms_norm", "pppppiif"),),
)
BF16_WEIGHT_LINEAR = CSource(
    CSRC / "bf16_weight_linear.c",
    1,
    # x, panels, bias, y, M, N, K
    (CSignature("deepinfer_bf16_weight_linear", "ppppiii"),),
)
DECODER_LAYER = CSource(
    CSRC / "decoder_layer.c",
    1,
    (
        # x, panels, bias, qkv, cos, sin, slots, k_cache, v_cache, T, H, hq, hkv, d
        CSignature("deepinfer_decoder_qkv", "pppppppppiiiii"),
        # attn, o_panels, residual, normed, post_w, gate_up_panels, down_panels, next_w, eps,
        # scratch, T, H, Q, I
        CSignature("deepinfer_decoder_mlp", "ppppppppfpiiii"),
    ),
)
QUANT_DECODER_LAYER = CSource(
    CSRC / "quant_decoder_layer.c",
    1,
    (
        # x, w, seg, bias, qkv, cos, sin, slots, k_cache, v_cache, T, H, hq, hkv, d
        CSignature("deepinfer_qdecoder_qkv", "ppppppppppiiiii"),
        # attn, o_w, o_seg, residual, normed, post_w, gate_up_w, gate_up_seg, down_w, down_seg,
        # next_w, eps, scratch, T, H, Q, I
        CSignature("deepinfer_qdecoder_mlp", "pppppppppppfpiiii"),
    ),
)
DSPARK_DRAFT = CSource(
    CSRC / "dspark_draft.c",
    1,
    (
        # anchor_embed, mask_embed, context, ctx_stride, valid, k_cos, k_sin, layers,
        # head_norm_w, head_eps, head_w, head_qtype, head_row_bytes, markov_in,
        # markov_out_panels, vocab_ids, conf_w, conf_b, anchor_ids, tokens, conf, hidden_out,
        # eps, B, G, W, m, L, H, hq, hkv, d, I, V, r
        CSignature("deepinfer_dspark_greedy_draft", "pppipppppfpiippppfppppfiiiiiiiiiiii", "i"),
        # features, shift, scale, proj_panels, norm_w, eps, kv_panels, out, T, F, H, C
        CSignature("deepinfer_dspark_context_kv", "pppppfppiiii", "i"),
    ),
)
PAGED_ATTENTION_TILES = CSource(
    CSRC / "paged_attention_tiles.c",
    1,
    (
        # q, q_stride, q_rows, row_start, k_cache, v_cache, page_ids, keep, o, lse, num_tiles,
        # max_q, num_pages, key_len, block_size, hq, hkv, d, scale, soft_cap
        CSignature("deepinfer_paged_attention_tiles", "pipippppppiiiiiiiiff", "i"),
    ),
)
# quant/cpu.py's QuantGemvKernel loads this file with its own copy of the ABI string; the
# torch-free wrappers (cpu/numpy_ops.py) load it through this entry (a test keeps the two equal).
# Not in ALL_SOURCES: it is built on first use, as before.
QUANT_GEMV = CSource(
    CSRC.parent.parent / "quant" / "csrc" / "quant_gemv.c",
    4,
    (
        # x, M, x_stride, w, N, K, row_bytes, qtype, bias, y
        CSignature("deepinfer_quant_linear", "piipiiiipp", "i"),
        # w, N, K, qtype, out
        CSignature("deepinfer_quant_dequantize", "piiip", "i"),
        # sgemm, x, M, x_stride, w, N, K, row_bytes, qtype, bias, y
        CSignature("deepinfer_quant_linear_sgemm", "ppiipiiiipp", "i"),
        # x, M, x_stride, w, I, K, row_bytes, qtype, y
        CSignature("deepinfer_quant_gated", "piipiiiip", "i"),
        # as deepinfer_quant_linear_sgemm, always on the sgemm (also on AVX-512 builds)
        CSignature("deepinfer_quant_linear_blas", "ppiipiiiipp", "i"),
        # 1: deepinfer_quant_linear_sgemm runs the kernel's own GEMM (AVX-512), 0: the sgemm
        CSignature("deepinfer_quant_own_gemm", "", "i"),
    ),
)
CAUSAL_PREFILL_ATTENTION = CSource(
    CSRC / "causal_prefill_attention.c",
    1,
    # sgemm, q, q_stride, k_cache, v_cache, o, T, start, hq, hkv, d, scale
    (CSignature("deepinfer_causal_prefill_attention", "ppipppiiiiif", "i"),),
)
VEC_MATH = CSource(
    CSRC / "vec_math.c",
    1,
    # x, y, n  (vec_math.h's expf over a buffer: tests, and callers wanting a vectorised exp)
    (CSignature("deepinfer_vec_expf", "ppi"),),
)

ALL_SOURCES: tuple[CSource, ...] = (
    ADD_RMS_NORM,
    BF16_WEIGHT_LINEAR,
    DECODER_LAYER,
    QUANT_DECODER_LAYER,
    DSPARK_DRAFT,
    PAGED_ATTENTION_TILES,
    CAUSAL_PREFILL_ATTENTION,
    VEC_MATH,
)
