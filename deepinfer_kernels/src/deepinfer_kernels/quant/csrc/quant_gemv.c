/* Products with weights kept in GGUF block formats, dequantised on the fly to fp32.
 *
 * y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]), W given as raw GGUF rows (row_bytes bytes per
 * row of K weights). Each thread takes a contiguous share of the output rows n and computes them
 * for every row of x with project_rows() (gguf_blocks.h), so every weight byte is read once per
 * call whatever M is. The weights' values are bit-identical to gguf.quants.dequantize; the sums
 * agree with a BLAS product to fp32 rounding, not bitwise (see gguf_blocks.h).
 *
 * ABI: deepinfer_abi_quant_gemv() returns "<version>|<symbol>(<args>)<ret>|..." (p pointer,
 * i int64, f float; return i int), checked by the Python side before any call.
 */
#include "gguf_blocks.h"
#include "gguf_panel.h"
#include "gguf_tile_rows.h"
#include "gguf_zmm_gemm.h"

const char *deepinfer_abi_quant_gemv(void) {
    return "4|deepinfer_quant_linear(piipiiiipp)i|deepinfer_quant_dequantize(piiip)i"
           "|deepinfer_quant_linear_sgemm(ppiipiiiipp)i|deepinfer_quant_gated(piipiiiip)i"
           "|deepinfer_quant_linear_blas(ppiipiiiipp)i|deepinfer_quant_own_gemm()i";
}

/* 1 where deepinfer_quant_linear_sgemm runs the kernel's own GEMM (built with AVX-512 and
 * without -DDEEPINFER_NO_ZMM_GEMM), 0 where it calls the caller's sgemm. */
int deepinfer_quant_own_gemm(void) {
#ifdef ZMM_GEMM
    return 1;
#else
    return 0;
#endif
}

/* y[M, N] (contiguous) = x[M, K] (row stride x_stride) W^T + bias.
 * Returns 0, -1 for an unknown type, -2 when a thread could not get its row buffer. */
int deepinfer_quant_linear(const float *x, int64_t M, int64_t x_stride, const uint8_t *w,
                           int64_t N, int64_t K, int64_t row_bytes, int64_t qtype,
                           const float *bias, float *y) {
    if (!known_type(qtype)) return -1;
    const int64_t seg[4] = {1, qtype, N, row_bytes};
#if defined(__AVX2__) && defined(__FMA__)
    if (tile_row_product(seg, M)) { /* 5-16 rows: each block decoded once (gguf_tile_rows.h) */
        tile_linear(x, x_stride, w, seg, bias, y, M, N, K);
        return 0;
    }
#endif
    if (!few_row_product(seg, M)) { /* dequantised panels, register-blocked (gguf_panel.h) */
        panel_linear(x, x_stride, w, seg, bias, y, M, N, K);
        return 0;
    }
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *row = (float *)aligned_alloc(64, (size_t)((K + 15) / 16 * 16) * sizeof(float));
        if (row == NULL) {
            failed = 1;
        } else {
            int64_t lo, hi;
            thread_share(N, &lo, &hi);
            project_rows(w + lo * row_bytes, row_bytes, hi - lo, (int)qtype, K, x, M, x_stride,
                         row, y, N, lo, bias);
            free(row);
        }
    }
    return failed ? -2 : 0;
}

/* A CBLAS sgemm with 64-bit integers (OpenBLAS's ILP64 interface, e.g. numpy's
 * scipy_cblas_sgemm64_): order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc. */
typedef void (*cblas_sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                                 int64_t, const float *, int64_t, float, float *, int64_t);

/* y[M, N] (contiguous) = x[M, K] (row stride x_stride) W^T + bias on a caller-given sgemm, for
 * many rows (prefill), whatever the build. Each OpenMP thread (torch's pool) dequantises its
 * share of W's rows into its own fp32 buffer and multiplies all of x by it, writing its columns
 * of y (ldc = N), so the sgemm must run single-threaded: no second thread pool competes with
 * torch's, and each thread's share is used while it is still in cache. Returns 0, -1 for an
 * unknown type, -2 when a thread could not get its buffer (y is then incomplete). */
int deepinfer_quant_linear_blas(void *sgemm, const float *x, int64_t M, int64_t x_stride,
                                const uint8_t *w, int64_t N, int64_t K, int64_t row_bytes,
                                int64_t qtype, const float *bias, float *y) {
    if (!known_type(qtype)) return -1;
    cblas_sgemm64_fn gemm = (cblas_sgemm64_fn)sgemm;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        int64_t lo, hi;
        thread_share(N, &lo, &hi);
        if (hi > lo) {
            size_t bytes = ((size_t)(hi - lo) * (size_t)K * sizeof(float) + 63) / 64 * 64;
            float *wf = (float *)aligned_alloc(64, bytes);
            if (wf == NULL) {
                failed = 1;
            } else {
                for (int64_t n = lo; n < hi; n++)
                    dequant_row(w + n * row_bytes, (int)qtype, K, wf + (n - lo) * K);
                /* 101 CblasRowMajor, 111 CblasNoTrans, 112 CblasTrans */
                gemm(101, 111, 112, M, hi - lo, K, 1.0f, x, x_stride, wf, K, 0.0f, y + lo, N);
                free(wf);
                if (bias != NULL)
                    for (int64_t m = 0; m < M; m++)
                        for (int64_t n = lo; n < hi; n++) y[m * N + n] += bias[n];
            }
        }
    }
    return failed ? -2 : 0;
}

/* The many-row product as the engine runs it: where the kernel is built with AVX-512 (see
 * deepinfer_quant_own_gemm) on its own GEMM instead of the sgemm (gguf_zmm_gemm.h: 1.06-1.09x
 * the sgemm's speed on SmolLM2's prefill shapes on a Zen 4 EPYC, one thread; sgemm is not
 * called), elsewhere deepinfer_quant_linear_blas. Same arguments and return codes. */
int deepinfer_quant_linear_sgemm(void *sgemm, const float *x, int64_t M, int64_t x_stride,
                                 const uint8_t *w, int64_t N, int64_t K, int64_t row_bytes,
                                 int64_t qtype, const float *bias, float *y) {
    if (!known_type(qtype)) return -1;
#ifdef ZMM_GEMM
    (void)sgemm;
    return zmm_gemm_linear(x, M, x_stride, w, N, K, row_bytes, (int)qtype, bias, y);
#else
    return deepinfer_quant_linear_blas(sgemm, x, M, x_stride, w, N, K, row_bytes, qtype, bias, y);
#endif
}

/* y[M, I] (contiguous) = silu(x Wg^T) * (x Wu^T), W's 2 I rows the gate's then the up's (one
 * format, row_bytes apart), x[M, K] with row stride x_stride: a SwiGLU MLP's gate, up and
 * activation in one pass on the AVX-512 GEMM (gguf_zmm_gemm.h). Returns 0, -1 for an unknown
 * type, -2 when a thread could not get its buffer, -3 where the kernel is built without
 * AVX-512 (nothing written: the caller takes the product and the activation separately). */
int deepinfer_quant_gated(const float *x, int64_t M, int64_t x_stride, const uint8_t *w, int64_t I,
                          int64_t K, int64_t row_bytes, int64_t qtype, float *y) {
    if (!known_type(qtype)) return -1;
#ifdef ZMM_GEMM
    return zmm_gated_linear(x, M, x_stride, w, I, K, row_bytes, (int)qtype, y);
#else
    (void)x, (void)M, (void)x_stride, (void)w, (void)I, (void)K, (void)row_bytes, (void)y;
    return -3;
#endif
}

/* out[N, K] = the fp32 values of N raw rows. Returns 0, or -1 for an unknown type. */
int deepinfer_quant_dequantize(const uint8_t *w, int64_t N, int64_t K, int64_t qtype, float *out) {
    if (!known_type(qtype)) return -1;
    int64_t block, size;
    block_geometry(qtype, &block, &size);
    int64_t row_bytes = K / block * size;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) dequant_row(w + n * row_bytes, (int)qtype, K, out + n * K);
    return 0;
}
