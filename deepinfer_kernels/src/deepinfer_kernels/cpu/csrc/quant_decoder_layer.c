/* The two halves of a Llama decoder layer around its attention, for a few rows, with the
 * projection weights in their GGUF formats (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32).
 *
 * The same computation as decoder_layer.c (see there and reference/cpu.py):
 *
 *   deepinfer_qdecoder_qkv: qkv = x Wqkv^T (+ b); RoPE on Q and K; K/V written at slots
 *   deepinfer_qdecoder_mlp: r = residual + a Wo^T; n = rmsnorm(r) * post_w;
 *                           residual = r + (silu(n Wg^T) * (n Wu^T)) Wd^T;
 *                           normed = rmsnorm(residual) * next_w
 *
 * Each weight is raw GGUF rows described by a segment table: int64 seg[0] = the number of
 * segments, then (qtype, rows, row_bytes) per segment, the segments' rows stored one after the
 * other (a fused QKV may join a Q4_K query with a Q6_K value, as mixed quantisations do). The
 * weights are dequantised on the fly, bit-identical to gguf.quants.dequantize, and multiplied
 * in fp32 (gguf_blocks.h): each weight row is read once per call for all T rows.
 *
 * Why: on GGUF weights a decode step used to run ~12 torch ops per layer, each quantised
 * product a ctypes call of its own; their dispatch cost more than their arithmetic. Here a
 * layer is two foreign calls around its attention. The products split their output rows between
 * the caller's OpenMP threads; the element-wise work stays on the calling thread.
 */
#include <math.h>
#include <stdint.h>

#include "../../quant/csrc/gguf_blocks.h"
#include "../../quant/csrc/gguf_panel.h"
#include "../../quant/csrc/gguf_tile_rows.h"
#include "add_rms_norm.c"
#include "rope_kv_write.c"
#include "vec_math.h"

/* y[T, N] = x[T, K] W^T (+ bias) for the segmented block weight (w, seg) of N rows. */
static void block_linear(const float *x, const uint8_t *w, const int64_t *seg, const float *bias,
                         float *y, int64_t T, int64_t N, int64_t K) {
#if defined(__AVX2__) && defined(__FMA__)
    if (tile_row_product(seg, T)) { /* 5-16 rows: each block decoded once (gguf_tile_rows.h) */
        tile_linear(x, K, w, seg, bias, y, T, N, K);
        return;
    }
#endif
    if (!few_row_product(seg, T)) { /* dequantised panels, register-blocked (gguf_panel.h) */
        panel_linear(x, K, w, seg, bias, y, T, N, K);
        return;
    }
    int64_t segments = seg[0];
#pragma omp parallel
    {
        float buf[K + 16] __attribute__((aligned(64)));
        const uint8_t *base = w;
        int64_t first = 0;
        for (int64_t s = 0; s < segments; s++) {
            int qtype = (int)seg[1 + 3 * s];
            int64_t rows = seg[2 + 3 * s], row_bytes = seg[3 + 3 * s];
            /* Each thread a contiguous share of the segment's rows, in one call (the format
             * dispatched once, not per row). Outputs of different segments are disjoint: no
             * barrier between them. */
            int64_t lo, hi;
            thread_share(rows, &lo, &hi);
            project_rows(base + lo * row_bytes, row_bytes, hi - lo, qtype, K, x, T, K, buf, y, N,
                         first + lo, bias);
            base += rows * row_bytes;
            first += rows;
        }
    }
}

void deepinfer_qdecoder_qkv(const float *x, const uint8_t *w, const int64_t *seg,
                            const float *bias, float *qkv, const float *cos, const float *sin,
                            const int64_t *slots, float *k_cache, float *v_cache, int64_t T,
                            int64_t H, int64_t hq, int64_t hkv, int64_t d) {
    block_linear(x, w, seg, bias, qkv, T, (hq + 2 * hkv) * d, H);
    rope_and_write_kv(qkv, cos, sin, slots, k_cache, v_cache, T, hq, hkv, d);
}

/* scratch: T * (2 H + 3 I) floats. */
void deepinfer_qdecoder_mlp(const float *attn, const uint8_t *o_w, const int64_t *o_seg,
                            float *residual, float *normed, const float *post_w,
                            const uint8_t *gate_up_w, const int64_t *gate_up_seg,
                            const uint8_t *down_w, const int64_t *down_seg, const float *next_w,
                            float eps, float *scratch, int64_t T, int64_t H, int64_t Q,
                            int64_t I) {
    float *delta = scratch;
    float *gate_up = delta + T * H;
    float *act = gate_up + T * 2 * I;
    float *down = act + T * I;
    block_linear(attn, o_w, o_seg, 0, delta, T, H, Q);
    deepinfer_add_rms_norm(residual, delta, post_w, residual, normed, T, H, eps);
    block_linear(normed, gate_up_w, gate_up_seg, 0, gate_up, T, 2 * I, H);
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * 2 * I, *u = g + I;
        float *m = act + t * I;
        /* silu(g) u = g / (1 + e^-g) u, the exponentials 8 lanes wide (vec_math.h) */
        for (int64_t i = 0; i < I; i++) m[i] = -g[i];
        expf_inplace(m, I);
        for (int64_t i = 0; i < I; i++) m[i] = (g[i] / (1.0f + m[i])) * u[i];
    }
    block_linear(act, down_w, down_seg, 0, down, T, H, I);
    deepinfer_add_rms_norm(residual, down, next_w, residual, normed, T, H, eps);
}

/* This file's entry of the signature table (deepinfer_kernels/cpu/sources.py): the loader
 * compares the two and refuses the library when they differ. */
const char *deepinfer_abi_quant_decoder_layer(void) { return "1|deepinfer_qdecoder_qkv(ppppppppppiiiii)v|deepinfer_qdecoder_mlp(pppppppppppfpiiii)v"; }
