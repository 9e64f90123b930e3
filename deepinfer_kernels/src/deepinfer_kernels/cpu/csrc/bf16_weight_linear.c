/* y = x W^T (+ b) in fp32 arithmetic, with W stored as bf16 bit patterns in column panels.
 *
 *   y[m, n] = sum_k x[m, k] * float(W[n, k]) (+ b[n]),  summed over k in increasing order
 *
 * x [M, K] fp32 row-major, y [M, N] fp32 row-major, b [N] fp32 or NULL. W arrives packed
 * (deepinfer_kernels.cpu.bf16_weight_linear.bf16_panels): panels of 32 output columns,
 * panels[p][k][i][h] = W[32 p + 16 h + i, k] (i < 16, h < 2), zero past N. float(W) is exact
 * (a bf16 value is the high half of an fp32 value) and products and sums are fp32 fused
 * multiply-adds, so for weights that are bf16 values (a bf16 checkpoint run in fp32) the result
 * is the fp32 product up to rounding in this summation order.
 *
 * Why: with few rows a product costs what reading its weights costs. Keeping bf16-exact
 * weights as bf16 halves those bytes with no loss.
 *
 * How:
 * - A panel's 32 weights for one k are one 64-byte line, read as 16 uint32 lanes: lane i holds
 *   column i (low half) and column 16 + i (high half), so (lane << 16) and
 *   (lane & 0xFFFF0000) are the fp32 weights of columns 0..15 and 16..31: two integer ops
 *   widen 32 weights.
 * - Each x[m, k] is broadcast and multiplied into the accumulators of 32 columns per row; up
 *   to ROWS rows share one pass over a panel (as many as keep the accumulators in registers:
 *   8 with AVX-512, 2 with AVX2), more rows take more passes over a panel that is by then in
 *   cache. No horizontal sums.
 * - Each thread streams whole panels, contiguous in memory, prefetching 4 KB ahead: the
 *   hardware prefetcher alone reached about two thirds of the machine's read bandwidth.
 * - Panels are split between the OpenMP threads of the caller (the runtime torch uses).
 *
 * Written with GCC/Clang vector extensions, so the same source compiles for AVX-512, AVX2
 * or NEON; it assumes a little-endian machine.
 */
#include <stdint.h>

/* Vectors of the machine's width: 16 lanes with AVX-512, else 8 (one AVX2 register, two NEON
 * ones). A 16-lane vector type on an AVX2 machine made GCC broadcast each x[m, k] through 16
 * stack stores and keep the accumulators on the stack: ~10x slower than MKL's fp32 product. */
#if defined(__AVX512F__)
#define LANES 16
#define ROWS 8          /* x rows per pass over a panel: 16 accumulators of 32 registers */
#else
#define LANES 8
#define ROWS 2          /* 8 accumulators + 4 weight vectors + 1 broadcast of 16 registers */
#endif
#define SPLIT (16 / LANES) /* vectors per 16 columns */

typedef float fvec __attribute__((vector_size(LANES * 4)));
typedef uint32_t uvec __attribute__((vector_size(LANES * 4)));
/* Panels are 64-byte lines when the tensor is 64-byte aligned (torch's CPU allocator); the
 * loads do not rely on it. */
typedef uint32_t uvec_any __attribute__((vector_size(LANES * 4), aligned(2)));

#define PANEL 32        /* output columns per panel */
#define PREFETCH 4096   /* bytes ahead in the panel stream */

#define DEFINE_PASS(G)                                                                        \
    static void pass_##G(const float *x, const uint16_t *panel, const float *bias, float *y,  \
                         int64_t m0, int64_t n0, int64_t N, int64_t K) {                      \
        fvec lo[G][SPLIT], hi[G][SPLIT];                                                      \
        for (int i = 0; i < G; i++)                                                           \
            for (int j = 0; j < SPLIT; j++) lo[i][j] = hi[i][j] = (fvec){0};                  \
        const char *stream = (const char *)panel;                                             \
        for (int64_t k = 0; k < K; k++) {                                                     \
            __builtin_prefetch(stream + k * 64 + PREFETCH, 0, 3);                             \
            fvec w_lo[SPLIT], w_hi[SPLIT];                                                    \
            for (int j = 0; j < SPLIT; j++) {                                                 \
                uvec lanes = *(const uvec_any *)(panel + k * PANEL + j * 2 * LANES);          \
                w_lo[j] = (fvec)(lanes << 16);                                                \
                w_hi[j] = (fvec)(lanes & 0xFFFF0000u);                                        \
            }                                                                                 \
            for (int i = 0; i < G; i++) {                                                     \
                float xv = x[(m0 + i) * K + k];                                               \
                for (int j = 0; j < SPLIT; j++) {                                             \
                    lo[i][j] += w_lo[j] * xv;                                                 \
                    hi[i][j] += w_hi[j] * xv;                                                 \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        for (int i = 0; i < G; i++) {                                                         \
            float *row = y + (m0 + i) * N + n0;                                               \
            for (int c = 0; c < 16; c++) {                                                    \
                float l = lo[i][c / LANES][c % LANES], h = hi[i][c / LANES][c % LANES];       \
                if (n0 + c < N) row[c] = bias ? l + bias[n0 + c] : l;                         \
                if (n0 + 16 + c < N) row[16 + c] = bias ? h + bias[n0 + 16 + c] : h;          \
            }                                                                                 \
        }                                                                                     \
    }

DEFINE_PASS(1) DEFINE_PASS(2)
#if ROWS == 8
DEFINE_PASS(3) DEFINE_PASS(4) DEFINE_PASS(5) DEFINE_PASS(6) DEFINE_PASS(7) DEFINE_PASS(8)
#endif

typedef void pass_fn(const float *, const uint16_t *, const float *, float *, int64_t, int64_t,
                     int64_t, int64_t);
static pass_fn *const PASSES[ROWS] = {
    pass_1, pass_2,
#if ROWS == 8
    pass_3, pass_4, pass_5, pass_6, pass_7, pass_8,
#endif
};

void deepinfer_bf16_weight_linear(const float *x, const uint16_t *panels, const float *bias,
                                  float *y, int64_t M, int64_t N, int64_t K) {
    int64_t num_panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < num_panels; p++) {
        const uint16_t *panel = panels + p * K * PANEL;
        for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
            int64_t g = M - m0 < ROWS ? M - m0 : ROWS;
            PASSES[g - 1](x, panel, bias, y, m0, p * PANEL, N, K);
        }
    }
}

/* This file's entry of the signature table (deepinfer_kernels/cpu/sources.py): the loader
 * compares the two and refuses the library when they differ. */
const char *deepinfer_abi_bf16_weight_linear(void) { return "1|deepinfer_bf16_weight_linear(ppppiii)v"; }
