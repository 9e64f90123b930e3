/* Products with weights kept in GGUF block formats, dequantised on the fly to fp32.
 *
 * y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]), W given as raw GGUF rows (row_bytes bytes per
 * row of K weights). Each thread takes whole output rows n: it dequantises row n once into a
 * K-float buffer (in L1/L2) and dots it with every row of x, so every weight byte is read once
 * per call whatever M is. Dequantisation follows gguf.quants (the Python reference) operation
 * by operation; every product there is exact in fp32 (an fp16 scale has 11 significant bits and
 * the integer factors at most 12), so the values are bit-identical to the reference with or
 * without FMA contraction. The dot products use 16 independent partial sums (vectorisable
 * without -ffast-math); they agree with a BLAS product to fp32 rounding, not bitwise.
 *
 * ABI: deepinfer_abi_quant_gemv() returns "<version>|<symbol>(<args>)<ret>|..." (p pointer,
 * i int64, f float; return i int), checked by the Python side before any call.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK_K 256

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q8_0 = 8,
       T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30 };

const char *deepinfer_abi_quant_gemv(void) {
    return "1|deepinfer_quant_linear(piipiiiipp)i|deepinfer_quant_dequantize(piiip)i";
}

static inline float f32_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* IEEE half -> float, exact (subnormals scaled by 2^-24, which is exact in fp32); the F16C
 * instruction where the CPU has it (same values, one instruction instead of branches). */
#if defined(__F16C__)
#include <immintrin.h>
static inline float half_to_float(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)(p[0] | (p[1] << 8)));
}
#else
static inline float half_to_float(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) return f32_bits(sign | 0x7f800000u | (mant << 13));
    return f32_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}
#endif

#if defined(__AVX2__)
#include <immintrin.h>
/* 8 codes (uint8 in the low 8 bytes of v) as floats. */
static inline __m256 codes_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
#endif

/* Q4_0 / Q4_1: low nibbles of the 16 code bytes are elements 0-15, high nibbles 16-31. gcc
 * does not vectorise 16-iteration byte loops with 32-byte vectors, hence the AVX2 path; both
 * compute d * q (+ m) as two roundings, like the reference. */
static void deq_q4_0(const uint8_t *restrict b, float *restrict out) {
    float d = half_to_float(b);
    const uint8_t *qs = b + 2;
#if defined(__AVX2__)
    __m128i bytes = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0f);
    __m128i halves[2] = {_mm_and_si128(bytes, mask), _mm_and_si128(_mm_srli_epi16(bytes, 4), mask)};
    __m256 vd = _mm256_set1_ps(d), eight = _mm256_set1_ps(8.0f);
    for (int h = 0; h < 2; h++) {
        __m256 a = _mm256_sub_ps(codes_to_ps(halves[h]), eight);
        __m256 c = _mm256_sub_ps(codes_to_ps(_mm_srli_si128(halves[h], 8)), eight);
        _mm256_storeu_ps(out + 16 * h, _mm256_mul_ps(vd, a));
        _mm256_storeu_ps(out + 16 * h + 8, _mm256_mul_ps(vd, c));
    }
#else
    for (int i = 0; i < 16; i++) out[i] = d * (float)((int)(qs[i] & 0x0f) - 8);
    for (int i = 0; i < 16; i++) out[i + 16] = d * (float)((int)(qs[i] >> 4) - 8);
#endif
}

static void deq_q4_1(const uint8_t *restrict b, float *restrict out) {
    float d = half_to_float(b), m = half_to_float(b + 2);
    const uint8_t *qs = b + 4;
#if defined(__AVX2__)
    __m128i bytes = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0f);
    __m128i halves[2] = {_mm_and_si128(bytes, mask), _mm_and_si128(_mm_srli_epi16(bytes, 4), mask)};
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int h = 0; h < 2; h++) {
        __m256 a = codes_to_ps(halves[h]), c = codes_to_ps(_mm_srli_si128(halves[h], 8));
        _mm256_storeu_ps(out + 16 * h, _mm256_add_ps(_mm256_mul_ps(vd, a), vm));
        _mm256_storeu_ps(out + 16 * h + 8, _mm256_add_ps(_mm256_mul_ps(vd, c), vm));
    }
#else
    for (int i = 0; i < 16; i++) out[i] = d * (float)(qs[i] & 0x0f) + m;
    for (int i = 0; i < 16; i++) out[i + 16] = d * (float)(qs[i] >> 4) + m;
#endif
}

static void deq_q8_0(const uint8_t *restrict b, float *restrict out) {
    float d = half_to_float(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) out[i] = (float)qs[i] * d;
}

/* The 6-bit scale and min of sub-block j from the 12 packed bytes of Q4_K / Q5_K. */
static inline void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

static void deq_q4_k(const uint8_t *restrict b, float *restrict out) {
    float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(scales, j, &sc, &mn);
        float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *q = qs + (j / 2) * 32;
        int shift = 4 * (j % 2);
        for (int l = 0; l < 32; l++) out[j * 32 + l] = ds * (float)((q[l] >> shift) & 0x0f) - dm;
    }
}

static void deq_q5_k(const uint8_t *restrict b, float *restrict out) {
    float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(scales, j, &sc, &mn);
        float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *q = qs + (j / 2) * 32;
        int shift = 4 * (j % 2);
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
            out[j * 32 + l] = ds * (float)v - dm;
        }
    }
}

static void deq_q6_k(const uint8_t *restrict b, float *restrict out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = half_to_float(b + 208), ds[16];
    for (int i = 0; i < 16; i++) ds[i] = d * (float)scales[i];
    /* Element h*128 + 32*k + l (k = 0..3, l = 0..31): low nibble of ql[h*64 + 32*(k&1) + l]
     * (the high one for k >= 2), bits 2k of qh[h*32 + l], scale ds[8h + 2k + l/16]. One
     * 32-wide loop per (h, k) with the scales spread into a vector vectorises. */
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 4; k++) {
            const uint8_t *l4 = ql + 64 * h + 32 * (k & 1), *h2 = qh + 32 * h;
            int lo_shift = 4 * (k >> 1), hi_shift = 2 * k;
            float sc[32];
            for (int l = 0; l < 32; l++) sc[l] = ds[8 * h + 2 * k + l / 16];
            float *o = out + 128 * h + 32 * k;
            for (int l = 0; l < 32; l++) {
                int q = ((l4[l] >> lo_shift) & 0x0f) | (((h2[l] >> hi_shift) & 3) << 4);
                o[l] = sc[l] * (float)(q - 32);
            }
        }
    }
}

/* Dequantise one row of K weights into out; returns 0, or -1 for an unknown type. */
static int dequant_row(const uint8_t *restrict row, int qtype, int64_t K, float *restrict out) {
    int64_t i;
    switch (qtype) {
    case T_F32: memcpy(out, row, (size_t)K * sizeof(float)); return 0;
    case T_F16: for (i = 0; i < K; i++) out[i] = half_to_float(row + 2 * i); return 0;
    case T_BF16:
        for (i = 0; i < K; i++) out[i] = f32_bits((uint32_t)(row[2 * i] | (row[2 * i + 1] << 8)) << 16);
        return 0;
    case T_Q4_0: for (i = 0; i < K / 32; i++) deq_q4_0(row + 18 * i, out + 32 * i); return 0;
    case T_Q4_1: for (i = 0; i < K / 32; i++) deq_q4_1(row + 20 * i, out + 32 * i); return 0;
    case T_Q8_0: for (i = 0; i < K / 32; i++) deq_q8_0(row + 34 * i, out + 32 * i); return 0;
    case T_Q4_K: for (i = 0; i < K / QK_K; i++) deq_q4_k(row + 144 * i, out + QK_K * i); return 0;
    case T_Q5_K: for (i = 0; i < K / QK_K; i++) deq_q5_k(row + 176 * i, out + QK_K * i); return 0;
    case T_Q6_K: for (i = 0; i < K / QK_K; i++) deq_q6_k(row + 210 * i, out + QK_K * i); return 0;
    default: return -1;
    }
}

static int known_type(int64_t qtype) {
    switch (qtype) {
    case T_F32: case T_F16: case T_BF16: case T_Q4_0: case T_Q4_1: case T_Q8_0:
    case T_Q4_K: case T_Q5_K: case T_Q6_K: return 1;
    default: return 0;
    }
}

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

/* y[M, N] (row stride y_stride) = x[M, K] (row stride x_stride) W^T + bias.
 * Returns 0, -1 for an unknown type, -2 when a thread could not get its row buffer. */
int deepinfer_quant_linear(const float *x, int64_t M, int64_t x_stride, const uint8_t *w,
                           int64_t N, int64_t K, int64_t row_bytes, int64_t qtype,
                           const float *bias, float *y) {
    if (!known_type(qtype)) return -1;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *row = (float *)aligned_alloc(64, (size_t)((K + 15) / 16 * 16) * sizeof(float));
        if (row == NULL) {
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; n++) {
                dequant_row(w + n * row_bytes, (int)qtype, K, row);
                float b = bias ? bias[n] : 0.0f;
                for (int64_t m = 0; m < M; m++) y[m * N + n] = dot(row, x + m * x_stride, K) + b;
            }
            free(row);
        }
    }
    return failed ? -2 : 0;
}

/* out[N, K] = the fp32 values of N raw rows. Returns 0, or -1 for an unknown type. */
int deepinfer_quant_dequantize(const uint8_t *w, int64_t N, int64_t K, int64_t qtype, float *out) {
    if (!known_type(qtype)) return -1;
    int64_t block = 1, size = 4;
    switch (qtype) {
    case T_F16: case T_BF16: size = 2; break;
    case T_Q4_0: block = 32; size = 18; break;
    case T_Q4_1: block = 32; size = 20; break;
    case T_Q8_0: block = 32; size = 34; break;
    case T_Q4_K: block = QK_K; size = 144; break;
    case T_Q5_K: block = QK_K; size = 176; break;
    case T_Q6_K: block = QK_K; size = 210; break;
    default: break;
    }
    int64_t row_bytes = K / block * size;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) dequant_row(w + n * row_bytes, (int)qtype, K, out + n * K);
    return 0;
}
