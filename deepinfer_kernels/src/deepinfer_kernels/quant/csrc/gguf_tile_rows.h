/* Block-format products for 5 to TILE_MAX_ROWS x rows (the decode step of 5-16 concurrent
 * sequences): y[t, n] = W[n] . x[t] (+ b[n]), W as raw GGUF rows (a header of static C
 * functions, included after gguf_blocks.h).
 *
 * Why: the panel path (gguf_panel.h) dequantises 12 weight rows at a time into an fp32 tile
 * of 12 K floats and multiplies it by the x rows in 6-row groups, so at 16 rows every weight
 * is written out as fp32 and read back three times, and the tile and the x rows do not fit L1
 * together (K = 576: 27 + 37 KB). On SmolLM2's shapes it ran at ~30% of one core's FMA peak.
 *
 * Two paths; tile_path() picks one by the row count (measured, see there):
 * - Lanes (tile_rows, 13-16 rows): the x rows are the vector lanes. Each thread packs x
 *   transposed once per call, xt[k][t] (16 lanes, unused ones zero), takes 6 weight rows at a
 *   time and, for each TILE_KC-weight slice of them, decodes their blocks once into a small
 *   L1 buffer (6 x 256 floats; load32()'s register decode, or dequant_row() for the K-quants:
 *   exactly gguf.quants.dequantize's values), then per k loads 2 xt vectors, broadcasts each
 *   weight and runs 12 FMAs into 12 register accumulators that live across the slices. Each
 *   weight is decoded once per call and never leaves L1. (At 5-8 rows the same code runs one
 *   vector of lanes and 12 weight rows at a time.)
 * - Groups (tile_groups, 5-10 rows of Q4_0/Q4_1/Q8_0/F32/F16/BF16): the 1-4 row register path
 *   of gguf_blocks.h (fused_dot: each 32-weight block decoded into registers and multiplied
 *   into up to 4 x rows at once) run over balanced groups of at most 4 x rows, the weight
 *   rows re-read from cache by every group after the first.
 *
 * Summation order of the lanes (documented; the groups keep fused_dot's): y[t, n] is one
 * chain of fused multiply-adds over k in increasing order from +0 (acc = fma(w[k], x[t, k],
 * acc)), then + bias[n]. A one-hot x row gives its weight exactly on either path (every other
 * term is +-0); the sums agree with a BLAS product to fp32 rounding, not bitwise.
 */
#ifndef DEEPINFER_GGUF_TILE_ROWS_H
#define DEEPINFER_GGUF_TILE_ROWS_H

#include <stdint.h>
#include <stdlib.h>

#include "gguf_blocks.h"

/* The most x rows the tile path takes (more go to the panels or the GEMM; fewer to the
 * register path of gguf_blocks.h). */
#define TILE_MAX_ROWS 16
/* The fewest (1-4 rows run the register path of gguf_blocks.h directly). */
#define TILE_MIN_ROWS 5
/* Vector accumulators of the inner loop: with the V x vectors and a broadcast weight, 15 of the
 * 16 AVX2 registers. */
#define TILE_ACC 12
/* Weights per decoded slice (a multiple of every block size, 256): 12 rows x 256 floats (12 KB)
 * plus the slice of xt (at most 16 KB) stay in a 32 KB L1. */
#ifndef TILE_KC
#define TILE_KC 256
#endif

#if defined(__AVX2__) && defined(__FMA__)

/* xt[k * 8 V + t] = x[t * xs + k] for t < T and k < K, 0 for T <= t < 8 V. */
static void tile_pack_x(const float *x, int64_t xs, int64_t T, int64_t K, int V, float *xt) {
    int64_t lanes = 8 * V;
    for (int64_t k = 0; k < K; k++) {
        float *o = xt + k * lanes;
        int64_t t = 0;
        for (; t < T; t++) o[t] = x[t * xs + k];
        for (; t < lanes; t++) o[t] = 0.0f;
    }
}

/* out[k] = the fp32 value of weight k < kc of row (kc a whole number of blocks, or any count
 * for the float formats): the register decode of the 1-4 row path (load32(), one FMA per 8
 * Q4 weights where deq_q4_1 rounds a product and a sum, the same values) where it applies,
 * dequant_row() otherwise. */
static inline void tile_decode(const uint8_t *row, int qtype, int64_t kc, float *out) {
    if (!fused_type(qtype)) {
        dequant_row(row, qtype, kc, out);
        return;
    }
    int64_t b = 0;
    for (; b < kc / 32; b++) {
        __m256 w[4];
        load32(row, qtype, b, w);
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(out + 32 * b + 8 * i, w[i]);
    }
    for (int64_t k = 32 * b; k < kc; k++) out[k] = weight_at(row, qtype, k);
}

/* acc[n][v] += sum over kc k-steps of wb[n * TILE_KC + k] * xt[k * 8 V + 8 v ...], NR and V
 * constants after inlining (each pair is its own loop). */
static inline __attribute__((always_inline)) void tile_slice(const float *restrict wb,
                                                             const float *restrict xt, int64_t kc,
                                                             const int NR, const int V,
                                                             __m256 acc[TILE_ACC]) {
    /* A local copy: gcc stores acc[] back every iteration when the loop updates it through
     * the pointer (it cannot prove the stores do not alias wb or xt). */
    __m256 a[TILE_ACC];
    for (int i = 0; i < NR * V; i++) a[i] = acc[i];
    /* unrolled 4 times: 55 against 39-45 GFLOP/s at 16 rows (one thread, loaded machine) */
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 x0 = _mm256_loadu_ps(xt + k * 8 * V);
        __m256 x1 = V == 2 ? _mm256_loadu_ps(xt + k * 8 * V + 8) : x0;
        for (int n = 0; n < NR; n++) {
            __m256 w = _mm256_broadcast_ss(wb + n * TILE_KC + k);
            a[n * V] = _mm256_fmadd_ps(w, x0, a[n * V]);
            if (V == 2) a[n * V + 1] = _mm256_fmadd_ps(w, x1, a[n * V + 1]);
        }
    }
    for (int i = 0; i < NR * V; i++) acc[i] = a[i];
}

/* y[t * N + n0 + r] = W[r] . x[t] (+ bias[n0 + r]) for the count rows r < count <= NR (stored
 * row_bytes apart from rows) and T x rows packed in xt. wb: NR * TILE_KC floats. */
static inline __attribute__((always_inline)) void tile_panel(
    const uint8_t *rows, int64_t row_bytes, int64_t count, int qtype, int64_t K, int64_t block,
    int64_t block_bytes, const float *xt, int64_t T, const int NR, const int V, float *wb,
    float *y, int64_t N, int64_t n0, const float *bias) {
    __m256 acc[TILE_ACC];
    for (int i = 0; i < NR * V; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += TILE_KC) {
        int64_t kc = K - k0 < TILE_KC ? K - k0 : TILE_KC;
        /* k0 is a multiple of 256, so of the block: the slice starts at a block boundary */
        const uint8_t *first = rows + k0 / block * block_bytes;
        for (int64_t r = 0; r < count; r++)
            tile_decode(first + r * row_bytes, qtype, kc, wb + r * TILE_KC);
        tile_slice(wb, xt + k0 * 8 * V, kc, NR, V, acc);
    }
    for (int64_t r = 0; r < count; r++) {
        float lanes[16] __attribute__((aligned(32)));
        for (int v = 0; v < V; v++) _mm256_store_ps(lanes + 8 * v, acc[r * V + v]);
        float b = bias ? bias[n0 + r] : 0.0f;
        for (int64_t t = 0; t < T && t < 8 * V; t++) y[t * N + n0 + r] = lanes[t] + b;
    }
}

/* tile_panel() over the count rows n0 .. n0 + count - 1, NR at a time. */
static inline __attribute__((always_inline)) void tile_panels(
    const uint8_t *rows, int64_t row_bytes, int64_t count, int qtype, int64_t K, const float *xt,
    int64_t T, const int V, float *wb, float *y, int64_t N, int64_t n0, const float *bias) {
    const int NR = TILE_ACC / V;
    int64_t block, block_bytes;
    block_geometry(qtype, &block, &block_bytes);
    /* rows past count in the last panel multiply zeros (their outputs are not stored) */
    for (int64_t i = 0; i < (int64_t)NR * TILE_KC; i++) wb[i] = 0.0f;
    for (int64_t r = 0; r < count; r += NR) {
        int64_t c = count - r < NR ? count - r : NR;
        tile_panel(rows + r * row_bytes, row_bytes, c, qtype, K, block, block_bytes, xt, T, NR,
                   V, wb, y, N, n0 + r, bias);
        if (c < NR) break;
    }
}

/* y[t * N + n] = W[n] . x[t] (+ bias[n]) for the count rows n = n0 .. n0 + count - 1 of one
 * known format (stored row_bytes apart from rows; bias: N floats or NULL) and T (1 to
 * TILE_MAX_ROWS) x rows x + t * xs, with the x rows as vector lanes. Returns 0, or -2 when the
 * packing buffer could not be allocated (nothing written: the caller takes another path). */
static int tile_rows(const uint8_t *rows, int64_t row_bytes, int64_t count, int qtype, int64_t K,
                     const float *x, int64_t T, int64_t xs, float *y, int64_t N, int64_t n0,
                     const float *bias) {
    if (count <= 0) return 0;
    int V = T > 8 ? 2 : 1;
    size_t xt_bytes = ((size_t)K * 8 * (size_t)V * sizeof(float) + 63) / 64 * 64;
    size_t wb_bytes = (size_t)TILE_ACC * TILE_KC * sizeof(float);
    float *xt = (float *)aligned_alloc(64, xt_bytes + wb_bytes);
    if (xt == NULL) return -2;
    float *wb = xt + xt_bytes / sizeof(float);
    tile_pack_x(x, xs, T, K, V, xt);
    if (V == 2)
        tile_panels(rows, row_bytes, count, qtype, K, xt, T, 2, wb, y, N, n0, bias);
    else
        tile_panels(rows, row_bytes, count, qtype, K, xt, T, 1, wb, y, N, n0, bias);
    free(xt);
    return 0;
}

/* The same rows on the register path of gguf_blocks.h (fused_rows_dispatch: each 32-weight
 * block decoded into registers per group of at most FUSED_MAX_ROWS x rows), the x rows in
 * balanced groups (5 rows as 2 + 3, 10 as 3 + 3 + 4). For a fused_type() qtype. */
static void tile_groups(const uint8_t *rows, int64_t row_bytes, int64_t count, int qtype,
                        int64_t K, const float *x, int64_t T, int64_t xs, float *y, int64_t N,
                        int64_t n0, const float *bias) {
    int64_t groups = (T + FUSED_MAX_ROWS - 1) / FUSED_MAX_ROWS;
    for (int64_t g = 0, t0 = 0; g < groups; g++) {
        int64_t t1 = T * (g + 1) / groups;
        const float *xg = x + t0 * xs, *b = bias ? bias + n0 : NULL;
        int R = (int)(t1 - t0);
        /* BF16 first tries its own 1-4 row loop (gguf_blocks.h), as project_rows() does */
        if (qtype != T_BF16 || !bf16_rows_split(rows, row_bytes, count, K, xg, xs, R, y + t0 * N,
                                                N, n0, b))
            fused_rows_dispatch(rows, row_bytes, count, qtype, K, xg, xs, R, y + t0 * N, N, n0, b);
        t0 = t1;
    }
}

#endif /* __AVX2__ && __FMA__ */

/* Which path a product of T x rows with a weight of format qtype takes here: 1 for the lanes
 * (tile_rows), 2 for the register groups (tile_groups), 0 for neither (the caller's own paths:
 * the 1-4 row register path, the panels, the GEMM). Measured against the panels on SmolLM2's
 * Q4_1 shapes, 30 layers' weights streamed as in a decode step, one thread
 * (benchmarks/quant_tile_rows_ab.py --layers 30): the lanes win at 16 rows (1.23x) and tie at
 * 13 (whole or nearly whole vectors of x rows; at 9-12 they pay for 16 lanes: 0.88-0.95x),
 * the groups win at 5-10 rows (1.04-1.23x) and lose at 11-12 (0.92-0.95x: three groups
 * re-reading the weights), so 11-12 rows and the K-quants below TILE_LANES_MIN_ROWS stay on
 * the panels. */
#ifndef TILE_LANES_MIN_ROWS
#define TILE_LANES_MIN_ROWS 13
#endif
#ifndef TILE_GROUPS_MAX_ROWS
#define TILE_GROUPS_MAX_ROWS 10
#endif
static inline int tile_path(int qtype, int64_t T) {
#if defined(__AVX2__) && defined(__FMA__)
    if (T >= TILE_LANES_MIN_ROWS && T <= TILE_MAX_ROWS) return 1;
    if (T >= TILE_MIN_ROWS && T <= TILE_GROUPS_MAX_ROWS && fused_type(qtype)) return 2;
#else
    (void)qtype;
    (void)T;
#endif
    return 0;
}

/* Whether every segment of the segmented weight seg (int64 count, then (qtype, rows,
 * row_bytes) each) takes a tile path at T rows. */
static inline int tile_row_product(const int64_t *seg, int64_t T) {
    for (int64_t s = 0; s < seg[0]; s++)
        if (!tile_path((int)seg[1 + 3 * s], T)) return 0;
    return seg[0] > 0;
}

#if defined(__AVX2__) && defined(__FMA__)
/* y[T, N] = x[T, K] (row stride xs) W^T (+ bias) for a segmented weight that
 * tile_row_product() accepts, each OpenMP thread of the caller's pool a contiguous share of
 * every segment's rows. A thread that cannot allocate its packing buffer computes its share
 * with project_rows() (same values up to summation order): nothing is left unwritten. */
static void tile_linear(const float *x, int64_t xs, const uint8_t *w, const int64_t *seg,
                        const float *bias, float *y, int64_t T, int64_t N, int64_t K) {
#pragma omp parallel
    {
        const uint8_t *base = w;
        int64_t first = 0;
        for (int64_t s = 0; s < seg[0]; s++) {
            int qtype = (int)seg[1 + 3 * s];
            int64_t rows = seg[2 + 3 * s], row_bytes = seg[3 + 3 * s], lo, hi;
            thread_share(rows, &lo, &hi);
            const uint8_t *mine = base + lo * row_bytes;
            if (tile_path(qtype, T) == 2) {
                tile_groups(mine, row_bytes, hi - lo, qtype, K, x, T, xs, y, N, first + lo, bias);
            } else if (tile_rows(mine, row_bytes, hi - lo, qtype, K, x, T, xs, y, N, first + lo,
                                 bias) != 0) {
                float buf[K + 16] __attribute__((aligned(64)));
                for (int64_t r = lo; r < hi; r++)
                    project_row(base + r * row_bytes, qtype, K, x, T, xs, buf, y, N, first + r,
                                bias ? bias[first + r] : 0.0f);
            }
            base += rows * row_bytes;
            first += rows;
        }
    }
}
#endif

#endif /* DEEPINFER_GGUF_TILE_ROWS_H */
