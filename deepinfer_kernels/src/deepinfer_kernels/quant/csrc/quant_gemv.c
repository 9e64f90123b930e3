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

const char *deepinfer_abi_quant_gemv(void) {
    return "1|deepinfer_quant_linear(piipiiiipp)i|deepinfer_quant_dequantize(piiip)i";
}

/* y[M, N] (contiguous) = x[M, K] (row stride x_stride) W^T + bias.
 * Returns 0, -1 for an unknown type, -2 when a thread could not get its row buffer. */
int deepinfer_quant_linear(const float *x, int64_t M, int64_t x_stride, const uint8_t *w,
                           int64_t N, int64_t K, int64_t row_bytes, int64_t qtype,
                           const float *bias, float *y) {
    if (!known_type(qtype)) return -1;
    const int64_t seg[4] = {1, qtype, N, row_bytes};
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
