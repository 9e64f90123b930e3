/* Many-row block-format products on AVX-512 (a prefill step): y[m, n] = W[n] . x[m] (+ b[n])
 * for M rows of x, W given as raw GGUF rows (a header of static C functions, included after
 * gguf_blocks.h).
 *
 * Why: the prefill's products ran on a one-thread OpenBLAS sgemm fed each thread's share of W
 * dequantised to fp32 rows (quant_gemv.c); on the 2-core AMD EPYC (Zen 4) of the benchmarks
 * that sgemm reached ~88-93 GFLOP/s on SmolLM2's shapes (K = 576 or 1536: its packing of x and
 * W is a visible share of so short a K). Here W's share is dequantised once per call straight
 * into the layout the micro-kernel reads, x is read in place (no packing), and the inner loop
 * is one 16-column vector of W and 16 FMAs whose x operand is an embedded broadcast.
 *
 * Layout and loops (per OpenMP thread, a contiguous share of whole 16-column panels of W):
 * - wt[p][k][j] = W[16 p + j][k] (j < 16; columns past N are zero), dequantised by
 *   dequant_row(): exactly gguf.quants.dequantize's values. K x 64 bytes a panel.
 * - x in chunks of ZG_CHUNK rows (kept in L2 while every panel of the share passes over them),
 *   each chunk in tiles of 16 rows: 16 accumulators acc[t] (16 output columns of row t) run
 *   over the whole K, acc[t] = fma(x[t][k], wt[k], acc[t]), then are stored as 16 consecutive
 *   floats of y's row (masked for a last, partial panel).
 *
 * Summation order (documented): y[m, n] is one chain of fused multiply-adds over k in
 * increasing order from +0, then + bias[n], the same order as the 13-16 row lanes of
 * gguf_tile_rows.h, so a row's output does not depend on how many rows share the call. A
 * one-hot x row gives its weight exactly; the sums agree with a BLAS product to fp32 rounding,
 * not bitwise.
 */
#ifndef DEEPINFER_GGUF_ZMM_GEMM_H
#define DEEPINFER_GGUF_ZMM_GEMM_H

#include <stdint.h>
#include <stdlib.h>

#include "gguf_blocks.h"
#include "../../cpu/csrc/vec_math.h"

#if defined(__AVX512F__) && !defined(DEEPINFER_NO_ZMM_GEMM)
#define ZMM_GEMM 1

/* Output columns a panel (one zmm of fp32). */
#define ZG_COLS 16
/* x rows a micro-tile, and panels (16 columns each) it covers: ZG_ROWS x ZG_PANELS
 * accumulators. */
#ifndef ZG_ROWS
#define ZG_ROWS 8
#endif
#ifndef ZG_PANELS
#define ZG_PANELS 2
#endif

/* k steps a partial sum: each output is a chain of at most ZG_KB fused multiply-adds, the
 * chains added in k order (one chain over K = 1536 erred up to 3x a BLAS's blocked sums, which
 * moved SmolLM2's prompt logits 1.9e-4 from transformers'). */
#ifndef ZG_KB
#define ZG_KB 128
#endif
/* x rows kept in L2 while the panels pass (128 rows x K = 1536 floats: 768 KB of 1 MB). */
#ifndef ZG_CHUNK
#define ZG_CHUNK 128
#endif

/* wt[k * 16 + j] = W[j][k] for the count (<= 16) rows j stored row_bytes apart from rows, 0 for
 * count <= j < 16. tmp: K floats. */
static void zg_pack_panel(const uint8_t *rows, int64_t row_bytes, int64_t count, int qtype,
                          int64_t K, float *tmp, float *wt) {
    for (int64_t j = 0; j < ZG_COLS; j++) {
        if (j < count) {
            dequant_row(rows + j * row_bytes, qtype, K, tmp);
            for (int64_t k = 0; k < K; k++) wt[k * ZG_COLS + j] = tmp[k];
        } else {
            for (int64_t k = 0; k < K; k++) wt[k * ZG_COLS + j] = 0.0f;
        }
    }
}

/* silu(g) u = (g / (1 + e^-g)) u lane by lane, with vec_math.h's expf8 on each half: the
 * same formula and exponential as the decode step's MLP (quant_decoder_layer.c). */
static inline __m512 zg_silu_mul(__m512 g, __m512 u) {
    __m512 e = _mm512_sub_ps(_mm512_setzero_ps(), g);
    __m256 lo = expf8(_mm512_castps512_ps256(e)), hi = expf8(_mm512_extractf32x8_ps(e, 1));
    e = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

/* y[t * N + 16 c + j] = x[t] . W[16 c + j] (+ bias[16 c + j]) for t < R x rows (row stride xs)
 * and the C (1 or 2) panels wt + c * panel (cols columns in all: the last panel may be
 * partial); y and bias point at the first panel's first column. R and C are constants after
 * inlining, so acc[] lives in registers (R = 8, C = 2: 16 accumulators, and the 8 x row
 * pointers still fit the general registers: at 16 rows gcc spilled them into the loop). */
static inline __attribute__((always_inline)) void zg_tile_any(
    const float *restrict x, int64_t xs, const float *restrict wt, int64_t panel, int64_t K,
    const int R, const int C, const int gated, float *y, int64_t N, int64_t cols,
    const float *bias) {
    __m512 acc[ZG_ROWS][ZG_PANELS], sum[ZG_ROWS][ZG_PANELS];
    for (int t = 0; t < R; t++)
        for (int c = 0; c < C; c++) sum[t][c] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += ZG_KB) {
        int64_t k1 = K - k0 < ZG_KB ? K : k0 + ZG_KB;
        for (int t = 0; t < R; t++)
            for (int c = 0; c < C; c++) acc[t][c] = _mm512_setzero_ps();
#pragma GCC unroll 2
        for (int64_t k = k0; k < k1; k++) {
            __m512 w[ZG_PANELS];
            for (int c = 0; c < C; c++) w[c] = _mm512_load_ps(wt + c * panel + k * ZG_COLS);
            for (int t = 0; t < R; t++) {
                __m512 xb = _mm512_set1_ps(x[t * xs + k]);
                for (int c = 0; c < C; c++) acc[t][c] = _mm512_fmadd_ps(xb, w[c], acc[t][c]);
            }
        }
        /* sum[] goes through memory (the registers hold acc[]): 16 adds per 128 x 16 FMAs */
        for (int t = 0; t < R; t++)
            for (int c = 0; c < C; c++) sum[t][c] = _mm512_add_ps(sum[t][c], acc[t][c]);
    }
    for (int t = 0; t < R; t++)
        for (int c = 0; c < C; c++) acc[t][c] = sum[t][c];
    if (gated) { /* C = 2: y[t][j] = silu(g) u for the gate acc[t][0] and the up acc[t][1] */
        __mmask16 keep = (__mmask16)(cols >= ZG_COLS ? 0xffff : (1u << cols) - 1u);
        for (int t = 0; t < R; t++)
            _mm512_mask_storeu_ps(y + t * N, keep, zg_silu_mul(acc[t][0], acc[t][1]));
        return;
    }
    for (int c = 0; c < C; c++) {
        int64_t left = cols - ZG_COLS * c;
        __mmask16 keep = (__mmask16)(left >= ZG_COLS ? 0xffff : (1u << left) - 1u);
        __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + ZG_COLS * c) : _mm512_setzero_ps();
        for (int t = 0; t < R; t++) {
            __m512 v = bias ? _mm512_add_ps(acc[t][c], b) : acc[t][c];
            _mm512_mask_storeu_ps(y + t * N + ZG_COLS * c, keep, v);
        }
    }
}

#define zg_tile(x, xs, wt, panel, K, R, C, y, N, cols, bias) \
    zg_tile_any(x, xs, wt, panel, K, R, C, 0, y, N, cols, bias)

/* zg_tile() of one panel (C = 1) for a runtime row count 1 <= R <= ZG_ROWS: the last tiles of
 * a chunk and the panels past the last whole group of ZG_PANELS. */
static void zg_tile_rows(const float *x, int64_t xs, const float *wt, int64_t K, int R, float *y,
                         int64_t N, int64_t cols, const float *bias) {
    switch (R) {
#define ZG_CASE(r) \
    case r: zg_tile(x, xs, wt, 0, K, r, 1, y, N, cols, bias); break;
        ZG_CASE(1) ZG_CASE(2) ZG_CASE(3) ZG_CASE(4) ZG_CASE(5) ZG_CASE(6) ZG_CASE(7)
#if ZG_ROWS > 8
        ZG_CASE(8) ZG_CASE(9) ZG_CASE(10) ZG_CASE(11)
#endif
#undef ZG_CASE
    default: zg_tile(x, xs, wt, 0, K, ZG_ROWS, 1, y, N, cols, bias); break;
    }
}

/* y[M, N] (contiguous) = x[M, K] (row stride xs) W^T (+ bias) for W's N rows of one known
 * format stored row_bytes apart. Each OpenMP thread of the caller's pool takes a contiguous
 * share of whole panels. Returns 0, or -2 when a thread could not get its buffer (y is then
 * incomplete). */
static int zmm_gemm_linear(const float *x, int64_t M, int64_t xs, const uint8_t *w, int64_t N,
                           int64_t K, int64_t row_bytes, int qtype, const float *bias, float *y) {
    int failed = 0;
    int64_t panels = (N + ZG_COLS - 1) / ZG_COLS;
#pragma omp parallel reduction(| : failed)
    {
        int64_t p_lo, p_hi;
        thread_share(panels, &p_lo, &p_hi);
        if (p_hi > p_lo) {
            size_t panel_floats = (size_t)K * ZG_COLS;
            size_t bytes = ((size_t)(p_hi - p_lo) * panel_floats + (size_t)K + 16) * sizeof(float);
            float *wt = (float *)aligned_alloc(64, (bytes + 63) / 64 * 64);
            if (wt == NULL) {
                failed = 1;
            } else {
                float *tmp = wt + (size_t)(p_hi - p_lo) * panel_floats;
                for (int64_t p = p_lo; p < p_hi; p++) {
                    int64_t n0 = p * ZG_COLS, cols = N - n0 < ZG_COLS ? N - n0 : ZG_COLS;
                    zg_pack_panel(w + n0 * row_bytes, row_bytes, cols, qtype, K, tmp,
                                  wt + (size_t)(p - p_lo) * panel_floats);
                }
                for (int64_t m0 = 0; m0 < M; m0 += ZG_CHUNK) {
                    int64_t m1 = M - m0 < ZG_CHUNK ? M : m0 + ZG_CHUNK;
                    for (int64_t p = p_lo; p < p_hi; p += ZG_PANELS) {
                        int C = (int)(p_hi - p < ZG_PANELS ? p_hi - p : ZG_PANELS);
                        int64_t n0 = p * ZG_COLS;
                        int64_t cols = N - n0 < ZG_COLS * C ? N - n0 : ZG_COLS * C;
                        const float *panel = wt + (size_t)(p - p_lo) * panel_floats;
                        const float *b = bias ? bias + n0 : NULL;
                        for (int64_t t = m0; t < m1; t += ZG_ROWS) {
                            int R = (int)(m1 - t < ZG_ROWS ? m1 - t : ZG_ROWS);
                            if (R == ZG_ROWS && C == ZG_PANELS) {
                                zg_tile(x + t * xs, xs, panel, (int64_t)panel_floats, K, ZG_ROWS,
                                        ZG_PANELS, y + t * N + n0, N, cols, b);
                                continue;
                            }
                            for (int c = 0; c < C; c++) { /* one panel at a time */
                                int64_t left = cols - ZG_COLS * c;
                                zg_tile_rows(x + t * xs, xs, panel + c * panel_floats, K, R,
                                             y + t * N + n0 + ZG_COLS * c, N,
                                             left < ZG_COLS ? left : ZG_COLS,
                                             b ? b + ZG_COLS * c : NULL);
                            }
                        }
                    }
                }
                free(wt);
            }
        }
    }
    return failed ? -2 : 0;
}

/* zg_tile_any() gated (gate and up panels a pair) for a runtime row count 1 <= R <= ZG_ROWS. */
static void zg_gated_rows(const float *x, int64_t xs, const float *wt, int64_t panel, int64_t K,
                          int R, float *y, int64_t N, int64_t cols) {
    switch (R) {
#define ZG_CASE(r) \
    case r: zg_tile_any(x, xs, wt, panel, K, r, 2, 1, y, N, cols, NULL); break;
        ZG_CASE(1) ZG_CASE(2) ZG_CASE(3) ZG_CASE(4) ZG_CASE(5) ZG_CASE(6) ZG_CASE(7)
#if ZG_ROWS > 8
        ZG_CASE(8) ZG_CASE(9) ZG_CASE(10) ZG_CASE(11)
#endif
#undef ZG_CASE
    default: zg_tile_any(x, xs, wt, panel, K, ZG_ROWS, 2, 1, y, N, cols, NULL); break;
    }
}

/* y[M, I] (contiguous) = silu(x Wg^T) * (x Wu^T) for W's 2 I rows of one known format (the gate
 * rows, then the up rows, stored row_bytes apart) and x[M, K] (row stride xs): a SwiGLU MLP's
 * first half in one pass, without the [M, 2 I] product in memory. Each OpenMP thread takes a
 * contiguous share of the gate's 16-column panels and the same panels of the up rows; the
 * products are zmm_gemm_linear()'s (same sums, same order). Returns 0, or -2 when a thread
 * could not get its buffer. */
static int zmm_gated_linear(const float *x, int64_t M, int64_t xs, const uint8_t *w, int64_t I,
                            int64_t K, int64_t row_bytes, int qtype, float *y) {
    int failed = 0;
    int64_t panels = (I + ZG_COLS - 1) / ZG_COLS;
#pragma omp parallel reduction(| : failed)
    {
        int64_t p_lo, p_hi;
        thread_share(panels, &p_lo, &p_hi);
        if (p_hi > p_lo) {
            size_t panel_floats = (size_t)K * ZG_COLS, mine = (size_t)(p_hi - p_lo);
            size_t bytes = (2 * mine * panel_floats + (size_t)K + 16) * sizeof(float);
            float *wt = (float *)aligned_alloc(64, (bytes + 63) / 64 * 64);
            if (wt == NULL) {
                failed = 1;
            } else {
                float *tmp = wt + 2 * mine * panel_floats;
                for (int64_t p = p_lo; p < p_hi; p++) {
                    int64_t n0 = p * ZG_COLS, cols = I - n0 < ZG_COLS ? I - n0 : ZG_COLS;
                    float *gate = wt + (size_t)(p - p_lo) * panel_floats;
                    zg_pack_panel(w + n0 * row_bytes, row_bytes, cols, qtype, K, tmp, gate);
                    zg_pack_panel(w + (I + n0) * row_bytes, row_bytes, cols, qtype, K, tmp,
                                  gate + mine * panel_floats);
                }
                int64_t up = (int64_t)(mine * panel_floats);
                for (int64_t m0 = 0; m0 < M; m0 += ZG_CHUNK) {
                    int64_t m1 = M - m0 < ZG_CHUNK ? M : m0 + ZG_CHUNK;
                    for (int64_t p = p_lo; p < p_hi; p++) {
                        int64_t n0 = p * ZG_COLS, cols = I - n0 < ZG_COLS ? I - n0 : ZG_COLS;
                        const float *gate = wt + (size_t)(p - p_lo) * panel_floats;
                        for (int64_t t = m0; t < m1; t += ZG_ROWS) {
                            int R = (int)(m1 - t < ZG_ROWS ? m1 - t : ZG_ROWS);
                            if (R == ZG_ROWS)
                                zg_tile_any(x + t * xs, xs, gate, up, K, ZG_ROWS, 2, 1,
                                            y + t * I + n0, I, cols, NULL);
                            else
                                zg_gated_rows(x + t * xs, xs, gate, up, K, R, y + t * I + n0, I,
                                              cols);
                        }
                    }
                }
                free(wt);
            }
        }
    }
    return failed ? -2 : 0;
}

#endif /* __AVX512F__ && !DEEPINFER_NO_ZMM_GEMM */

#endif /* DEEPINFER_GGUF_ZMM_GEMM_H */
