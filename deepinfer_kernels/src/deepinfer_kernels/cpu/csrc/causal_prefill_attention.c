/* Causal attention of a long prompt chunk over a contiguous fp32 KV cache, on a caller-given
 * one-thread sgemm (numpy's OpenBLAS ILP64 cblas_sgemm, as quant_gemv.c's many-row products).
 *
 * Query row t (0 <= t < T) sits at position start + t and attends to keys 0 .. start + t; key
 * j is slot j of the caches [slots, Hkv, D] (one sequence whose pages are in order, as the
 * lean runtime's KV cache). For query head h (KV head h / (Hq / Hkv)):
 *
 *   o[t, h] = sum_j softmax_j(scale * q[t, h] . k[j]) v[j]
 *
 * Why: paged_attention_tiles.c runs short tiles (decode, verification) well, but a 2k-token
 * causal prefill through it spends most of its time in per-key dot products and value sums of
 * 16-row tiles: 46% of the lean runtime's prefill. Here each work item (a query head and a
 * block of QB rows) is two GEMMs of the BLAS's register-blocked kernels: S = Q K^T over the
 * keys up to the block's last row, then P V, with the causal mask and softmax between them
 * (8-lane exponentials, vec_math.h). The diagonal block's masked scores are the only wasted
 * work. Items are shared out dynamically between the caller's OpenMP threads (late blocks
 * have more keys), each with its own score buffer; the sgemm must run single-threaded.
 *
 * Returns 0, or -2 when a thread could not get its score buffer (o is then incomplete).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vec_math.h"

#define QB 64 /* query rows a work item: its score block (QB x keys) stays in L2 at 2k keys */

/* CBLAS sgemm, 64-bit integers: order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta,
 * C, ldc (101 RowMajor, 111 NoTrans, 112 Trans). */
typedef void (*cblas_sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                                 int64_t, const float *, int64_t, float, float *, int64_t);

/* row[j] = e^(row[j] - max) for j < n; returns their sum (n >= 1). 8 lanes at a time with AVX2
 * (a scalar max / exp / sum per score was half of this kernel's time at 2k keys). */
static float softmax_numerators(float *row, int64_t n) {
    int64_t j = 0;
    float m = -INFINITY, l = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(row + j));
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
#endif
    for (; j < n; j++) m = row[j] > m ? row[j] : m;
    j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 sub = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m256 e = expf8(_mm256_sub_ps(_mm256_loadu_ps(row + j), sub));
        _mm256_storeu_ps(row + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(lanes, acc);
    for (int i = 0; i < 8; i++) l += lanes[i];
#endif
    for (int64_t i = j; i < n; i++) row[i] -= m;
    expf_inplace(row + j, n - j);
    for (; j < n; j++) l += row[j];
    return l;
}

int deepinfer_causal_prefill_attention(void *sgemm, const float *q, int64_t q_stride,
                                       const float *k_cache, const float *v_cache, float *o,
                                       int64_t T, int64_t start, int64_t hq, int64_t hkv,
                                       int64_t d, float scale) {
    cblas_sgemm64_fn gemm = (cblas_sgemm64_fn)sgemm;
    int64_t blocks = (T + QB - 1) / QB, group = hq / hkv, kv_stride = hkv * d;
    int64_t max_keys = start + T;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *s = (float *)aligned_alloc(64, ((size_t)QB * (size_t)max_keys * 4 + 63) / 64 * 64);
        if (s == NULL) failed = 1;
        /* Every thread joins the loop (a failed one skips its items' work, flagged above). */
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < blocks * hq; item++) {
            if (s == NULL) continue;
            /* Late (long) blocks first: the dynamic schedule then ends evenly. */
            int64_t b = blocks - 1 - item / hq, h = item % hq, kvh = h / group;
            int64_t q0 = b * QB, rows = T - q0 < QB ? T - q0 : QB;
            int64_t keys = start + q0 + rows;
            gemm(101, 111, 112, rows, keys, d, scale, q + q0 * q_stride + h * d, q_stride,
                 k_cache + kvh * d, kv_stride, 0.0f, s, keys);
            float inv[QB];
            for (int64_t r = 0; r < rows; r++) {
                float *row = s + r * keys;
                int64_t kept = start + q0 + r + 1;
                inv[r] = 1.0f / softmax_numerators(row, kept);
                for (int64_t j = kept; j < keys; j++) row[j] = 0.f; /* the causal mask */
            }
            float *out = o + q0 * hq * d + h * d;
            gemm(101, 111, 111, rows, d, keys, 1.0f, s, keys, v_cache + kvh * d, kv_stride, 0.0f,
                 out, hq * d);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t e = 0; e < d; e++) out[r * hq * d + e] *= inv[r];
        }
        free(s);
    }
    return failed ? -2 : 0;
}

/* This file's entry of the signature table (deepinfer_kernels/cpu/sources.py). */
const char *deepinfer_abi_causal_prefill_attention(void) { return "1|deepinfer_causal_prefill_attention(ppipppiiiiif)i"; }
