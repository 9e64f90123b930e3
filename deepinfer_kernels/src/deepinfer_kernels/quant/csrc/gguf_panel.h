/* The multi-row (T > 2) product over GGUF block formats: y[T, N] = x[T, K] W^T (+ b), W given
 * as raw GGUF rows (a header of static C functions, included after gguf_blocks.h).
 *
 * Why: with more than two activation rows a product is no longer bound by reading the weights
 * but by the arithmetic and by how often each float is loaded. The row-at-a-time path
 * (project_row: dequantise one weight row, dot it with four x rows) loads 5 vectors per 4 FMAs
 * and reads every x row again for every weight row, so the x rows stream from L2 once per
 * weight row.
 *
 * How:
 * - Each thread takes panels of PANEL_ROWS consecutive output rows (one segment, so one
 *   format) and dequantises them once into a 64-byte-aligned fp32 tile with dequant_row(), the
 *   same deq_* code as everywhere else: the tile holds exactly gguf.quants.dequantize's values.
 * - A register-blocked micro-kernel then multiplies MICRO_N tile rows by MICRO_T x rows:
 *   2 x 6 = 12 vector accumulators plus 2 weight vectors and one x vector (15 of the 16 AVX2
 *   registers), 8 loads per 12 FMAs, where the row path loaded 5 per 4. Each x group is used
 *   for every 2-row slice of the tile while it is in L1/L2.
 * - The reduction over k runs in chunks of K_CHUNK weights, so that the micro-kernel's eight
 *   streams stay in L2 for very long rows; partial sums are added into y.
 * - Written with GCC/Clang vector extensions (8 floats), so the same source compiles to AVX2
 *   with FMA contraction under -march=native, to SSE or NEON elsewhere: there is no separate
 *   portable fallback to keep in step.
 * - A thread that cannot allocate its tile computes its rows with project_row() instead
 *   (slower, same values up to summation order): nothing is left unwritten.
 *
 * The sums run in another order than a BLAS product (8 lanes per chunk, then the chunks), so
 * they agree with it to fp32 rounding, not bitwise; the weights themselves are exact.
 */
#ifndef DEEPINFER_GGUF_PANEL_H
#define DEEPINFER_GGUF_PANEL_H

#include <stdint.h>
#include <stdlib.h>

#include "gguf_blocks.h"

/* Tile shapes measured on a 2-core AMD EPYC (AVX2, single thread, Q4_1 SmolLM2 shapes): 2 x 6
 * beat 3 x 4, 2 x 4, 2 x 5 and 4 x 2 at T = 16, 64 and 512; chunking k at 128-512 was slower
 * than none for K <= 1536 (each chunk pays the reduction and a store). */
#define PANEL_ROWS 12 /* weight rows dequantised together (a multiple of MICRO_N) */
#define MICRO_N 2     /* weight rows per micro-kernel call */
#define MICRO_T 6     /* x rows per micro-kernel call */
#define K_CHUNK 4096  /* weights per reduction chunk (a multiple of 8): 8 streams of 16 KB */

typedef float panel_f32x8 __attribute__((vector_size(32)));
/* The same vector read from any float address (tile rows are aligned only when K % 8 == 0). */
typedef float panel_f32x8_any __attribute__((vector_size(32), aligned(4)));

/* Keeps a loaded x vector in a register for its NR uses: left alone, gcc folds the load into
 * every FMA (NR loads instead of one), which makes the loop bound by loads, not FMAs. */
#if defined(__AVX__) && (defined(__GNUC__) || defined(__clang__))
#define PANEL_IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define PANEL_IN_REGISTER(v) ((void)0)
#endif

static inline float panel_hsum(panel_f32x8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* y[t * N + i] (+)= sum_{k0 <= k < k1} w[i * K + k] x[t * xs + k] for i < NR, t < MR, NR and
 * MR compile-time constants after inlining (each (NR, MR) pair is its own loop). The first
 * chunk writes (with the bias), later chunks add. */
static inline __attribute__((always_inline)) void panel_micro(
    const float *restrict w, int64_t K, const float *restrict x, int64_t xs, int64_t k0,
    int64_t k1, const int NR, const int MR, float *restrict y, int64_t N,
    const float *restrict bias) {
    panel_f32x8 acc[MICRO_N][MICRO_T];
    for (int i = 0; i < NR; i++)
        for (int t = 0; t < MR; t++) acc[i][t] = (panel_f32x8){0};
    int64_t k = k0;
    for (; k + 8 <= k1; k += 8) {
        panel_f32x8 wv[MICRO_N];
        for (int i = 0; i < NR; i++) wv[i] = *(const panel_f32x8_any *)(w + i * K + k);
        for (int t = 0; t < MR; t++) {
            panel_f32x8 xv = *(const panel_f32x8_any *)(x + t * xs + k);
            PANEL_IN_REGISTER(xv);
            for (int i = 0; i < NR; i++) acc[i][t] += wv[i] * xv;
        }
    }
    for (int i = 0; i < NR; i++) {
        for (int t = 0; t < MR; t++) {
            float s = panel_hsum(acc[i][t]);
            for (int64_t j = k; j < k1; j++) s += w[i * K + j] * x[t * xs + j];
            float *out = y + t * N + i;
            *out = k0 == 0 ? s + (bias ? bias[i] : 0.0f) : *out + s;
        }
    }
}

#define PANEL_MICRO_CASE(NR, MR)                                                              \
    case (NR) * 8 + (MR):                                                                     \
        panel_micro(w, K, x, xs, k0, k1, NR, MR, y, N, bias);                                 \
        return;

static void panel_micro_dispatch(int nr, int mr, const float *w, int64_t K, const float *x,
                                 int64_t xs, int64_t k0, int64_t k1, float *y, int64_t N,
                                 const float *bias) {
    switch (nr * 8 + mr) {
    PANEL_MICRO_CASE(2, 6) PANEL_MICRO_CASE(2, 5) PANEL_MICRO_CASE(2, 4)
    PANEL_MICRO_CASE(2, 3) PANEL_MICRO_CASE(2, 2) PANEL_MICRO_CASE(2, 1)
    PANEL_MICRO_CASE(1, 6) PANEL_MICRO_CASE(1, 5) PANEL_MICRO_CASE(1, 4)
    PANEL_MICRO_CASE(1, 3) PANEL_MICRO_CASE(1, 2) PANEL_MICRO_CASE(1, 1)
    default: return;
    }
}
#undef PANEL_MICRO_CASE

/* y[t * N + n0 + p] = tile[p] . x[t] (+ bias[n0 + p]) for p < P rows of the tile (row stride
 * K) and every t < T. */
static void panel_product(const float *tile, int64_t P, int64_t K, const float *x, int64_t T,
                          int64_t xs, float *y, int64_t N, int64_t n0, const float *bias) {
    for (int64_t k0 = 0; k0 < K; k0 += K_CHUNK) {
        int64_t k1 = K - k0 > K_CHUNK ? k0 + K_CHUNK : K;
        for (int64_t t = 0; t < T; t += MICRO_T) {
            int mr = (int)(T - t < MICRO_T ? T - t : MICRO_T);
            for (int64_t p = 0; p < P; p += MICRO_N) {
                int nr = (int)(P - p < MICRO_N ? P - p : MICRO_N);
                panel_micro_dispatch(nr, mr, tile + p * K, K, x + t * xs, xs, k0, k1,
                                     y + t * N + n0 + p, N, bias ? bias + n0 + p : 0);
            }
        }
    }
}

/* y[T, N] = x[T, K] (row stride xs) W^T (+ bias) for a weight of N raw GGUF rows described by
 * a segment table (int64 seg[0] segments, then (qtype, rows, row_bytes) each; rows stored one
 * segment after the other, every qtype known). Output rows are split between the caller's
 * OpenMP threads in panels. */
static void panel_linear(const float *x, int64_t xs, const uint8_t *w, const int64_t *seg,
                         const float *bias, float *y, int64_t T, int64_t N, int64_t K) {
    int64_t segments = seg[0];
#pragma omp parallel
    {
        size_t tile_bytes = ((size_t)(PANEL_ROWS * K) * sizeof(float) + 63) / 64 * 64;
        float *tile = (float *)aligned_alloc(64, tile_bytes);
        const uint8_t *base = w;
        int64_t first = 0;
        for (int64_t s = 0; s < segments; s++) {
            int qtype = (int)seg[1 + 3 * s];
            int64_t rows = seg[2 + 3 * s], row_bytes = seg[3 + 3 * s];
            int64_t panels = (rows + PANEL_ROWS - 1) / PANEL_ROWS;
            /* Outputs of different segments are disjoint: no barrier between them. */
#pragma omp for schedule(static) nowait
            for (int64_t p = 0; p < panels; p++) {
                int64_t r0 = p * PANEL_ROWS;
                int64_t pr = rows - r0 < PANEL_ROWS ? rows - r0 : PANEL_ROWS;
                if (tile != NULL) {
                    for (int64_t i = 0; i < pr; i++)
                        dequant_row(base + (r0 + i) * row_bytes, qtype, K, tile + i * K);
                    panel_product(tile, pr, K, x, T, xs, y, N, first + r0, bias);
                } else {
                    float buf[K + 16] __attribute__((aligned(64)));
                    for (int64_t i = 0; i < pr; i++) {
                        int64_t n = first + r0 + i;
                        project_row(base + (r0 + i) * row_bytes, qtype, K, x, T, xs, buf, y, N,
                                    n, bias ? bias[n] : 0.0f);
                    }
                }
            }
            base += rows * row_bytes;
            first += rows;
        }
        free(tile);
    }
}

#endif /* DEEPINFER_GGUF_PANEL_H */
