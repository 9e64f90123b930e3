/* GGUF block formats on the CPU: exact dequantisation and fused dot products (a header of C
 * functions, included by quant_gemv.c and cpu/csrc/quant_decoder_layer.c; every function is
 * static, so each library gets its own copy).
 *
 * Dequantisation follows gguf.quants (the Python reference) operation by operation; every
 * product there is exact in fp32 (an fp16 scale has 11 significant bits and the integer factors
 * at most 12 bits), so the values are bit-identical to the reference with or without FMA
 * contraction: d * q + m rounds once either way because d * q is exact.
 *
 * project_row() computes one output column of y = x W^T for every row of x, project_rows() a
 * run of them: the weight row is read once per call whatever the number of x rows. For one to
 * four x rows of Q4_0, Q4_1, Q8_0, F32, F16 and BF16 weights (AVX2 + FMA) each 32-weight block
 * is decoded into registers once and multiplied into every x row straight away (no store and
 * reload of the fp32 values: at batch 1 that halves the instructions per weight, and a 2-4 row
 * verify step shares the decode), with the row loop inside the code specialised for the
 * format; otherwise the row is dequantised once into a K-float buffer
 * (L1) and dotted with the x rows, four at a time. The sums run in another order than a BLAS
 * product, so they agree with it to fp32 rounding, not bitwise.
 *
 * The batch-1 decode is bound by instructions about as much as by memory: ~0.1 ns per Q4_1
 * weight on one core with the weights in cache, about as fast as from DRAM (docs/kernels.md).
 * So the Q4 path counts instructions: per block a broadcast load and conversion per fp16 scale,
 * two widening loads of the code bytes, the nibbles split in 256-bit lanes, then per 8 weights
 * one int->float conversion, one FMA for fl(d q + m) and one FMA into the sum (the fewest for
 * exact fp32 weights: llama.cpp's integer dot products need int8 activations, which the
 * exactness rule of #24 excludes).
 */
#ifndef DEEPINFER_GGUF_BLOCKS_H
#define DEEPINFER_GGUF_BLOCKS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#define QK_K 256

/* The most x rows the fused block path (fused_dot) takes at once. */
#define FUSED_MAX_ROWS 4

/* How far ahead of the block being decoded the fused path prefetches its weights (bytes; a
 * thread's rows are contiguous, so this runs on into its next rows). The hardware prefetcher
 * alone left the Q8_0 LM head (30 MB a token) at ~0.7 of one core's streaming read;
 * 4-8 KiB ahead, ~0.85-0.95 (one thread, CPU time, loaded machine). */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4096
#endif

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q8_0 = 8,
       T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30 };

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

#if defined(__AVX2__)
/* The 32 codes of v (one byte each) as floats: out[i] = ds * v[i] - dm, each product exact
 * (fp16 scale x 6-bit scale x 6-bit code < 24 bits), so one rounding, as the reference's. */
static inline void k_codes_to_ps(__m256i v, float ds, float dm, float *out) {
    __m256 vds = _mm256_set1_ps(ds), vdm = _mm256_set1_ps(dm);
    __m128i half[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
    for (int h = 0; h < 2; h++) {
        _mm256_storeu_ps(out + 16 * h, _mm256_sub_ps(_mm256_mul_ps(vds, codes_to_ps(half[h])), vdm));
        _mm256_storeu_ps(out + 16 * h + 8,
                         _mm256_sub_ps(_mm256_mul_ps(vds, codes_to_ps(_mm_srli_si128(half[h], 8))),
                                       vdm));
    }
}
#endif

/* Q4_K / Q5_K: sub-block j's codes are the low (j even) or high (j odd) nibbles of the 32
 * bytes qs[32 (j / 2) ...], Q5_K's fifth bit bit j of qh[l]. With AVX2 each sub-block is one
 * 32-byte load, a shift and a mask, then the same multiply and subtract as the scalar loop
 * (which gcc compiled to byte-at-a-time code: ~1.2 GB of weights per CPU second). */
static void deq_q4_k(const uint8_t *restrict b, float *restrict out) {
    float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(scales, j, &sc, &mn);
        float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *q = qs + (j / 2) * 32;
        int shift = 4 * (j % 2);
#if defined(__AVX2__)
        __m256i v = _mm256_loadu_si256((const __m256i *)q);
        v = _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(0x0f));
        k_codes_to_ps(v, ds, dm, out + j * 32);
#else
        for (int l = 0; l < 32; l++) out[j * 32 + l] = ds * (float)((q[l] >> shift) & 0x0f) - dm;
#endif
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
#if defined(__AVX2__)
        __m256i v = _mm256_loadu_si256((const __m256i *)q);
        v = _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(0x0f));
        __m256i hi = _mm256_loadu_si256((const __m256i *)qh);
        hi = _mm256_and_si256(_mm256_srli_epi16(hi, j), _mm256_set1_epi8(1));
        v = _mm256_or_si256(v, _mm256_slli_epi16(hi, 4)); /* 0/1 per byte: no carry across */
        k_codes_to_ps(v, ds, dm, out + j * 32);
#else
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
            out[j * 32 + l] = ds * (float)v - dm;
        }
#endif
    }
}

static void deq_q6_k(const uint8_t *restrict b, float *restrict out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = half_to_float(b + 208), ds[16];
    for (int i = 0; i < 16; i++) ds[i] = d * (float)scales[i];
    /* Element h*128 + 32*k + l (k = 0..3, l = 0..31): low nibble of ql[h*64 + 32*(k&1) + l]
     * (the high one for k >= 2), bits 2k of qh[h*32 + l], scale ds[8h + 2k + l/16]. Without
     * AVX2, one 32-wide loop per (h, k) with the scales spread into a vector; gcc made
     * byte-at-a-time code of it (~1.2 GB of weights per CPU second, 4.5 with AVX2). */
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 4; k++) {
            const uint8_t *l4 = ql + 64 * h + 32 * (k & 1), *h2 = qh + 32 * h;
            int lo_shift = 4 * (k >> 1), hi_shift = 2 * k;
#if defined(__AVX2__)
            /* 32 codes: one load of each byte run, shifts and masks, then (q - 32) as int32 and
             * one product with the scale, as the scalar loop below rounds it. */
            __m256i v = _mm256_and_si256(
                _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)l4), lo_shift),
                _mm256_set1_epi8(0x0f));
            __m256i hb = _mm256_and_si256(
                _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)h2), hi_shift),
                _mm256_set1_epi8(3));
            v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4)); /* <= 3 per byte: no carry */
            __m128i half[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
            __m256i off = _mm256_set1_epi32(32);
            float *o6 = out + 128 * h + 32 * k;
            for (int g = 0; g < 2; g++) { /* g: elements 16 g .. 16 g + 15, one scale */
                __m256 vs = _mm256_set1_ps(ds[8 * h + 2 * k + g]);
                __m256i a = _mm256_sub_epi32(_mm256_cvtepu8_epi32(half[g]), off);
                __m256i c = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(half[g], 8)), off);
                _mm256_storeu_ps(o6 + 16 * g, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(a)));
                _mm256_storeu_ps(o6 + 16 * g + 8, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(c)));
            }
#else
            float sc[32];
            for (int l = 0; l < 32; l++) sc[l] = ds[8 * h + 2 * k + l / 16];
            float *o = out + 128 * h + 32 * k;
            for (int l = 0; l < 32; l++) {
                int q = ((l4[l] >> lo_shift) & 0x0f) | (((h2[l] >> hi_shift) & 3) << 4);
                o[l] = sc[l] * (float)(q - 32);
            }
#endif
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

static inline int known_type(int64_t qtype) {
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


/* Elements and bytes per block of a known type (1 and 4 for an unknown one). */
static inline void block_geometry(int64_t qtype, int64_t *block, int64_t *size) {
    *block = 1;
    *size = 4;
    switch (qtype) {
    case T_F16: case T_BF16: *size = 2; break;
    case T_Q4_0: *block = 32; *size = 18; break;
    case T_Q4_1: *block = 32; *size = 20; break;
    case T_Q8_0: *block = 32; *size = 34; break;
    case T_Q4_K: *block = QK_K; *size = 144; break;
    case T_Q5_K: *block = QK_K; *size = 176; break;
    case T_Q6_K: *block = QK_K; *size = 210; break;
    default: break;
    }
}

#if defined(__AVX2__) && defined(__FMA__)
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The fp16 value at p in all 8 lanes: a broadcast load and one conversion (exact), 6-12% faster
 * per Q4_0/Q4_1/Q8_0 block than converting a scalar and broadcasting the float. */
static inline __m256 broadcast_half(const uint8_t *p) {
#if defined(__F16C__)
    uint16_t bits;
    memcpy(&bits, p, sizeof bits);
    return _mm256_cvtph_ps(_mm_set1_epi16((short)bits));
#else
    return _mm256_set1_ps(half_to_float(p));
#endif
}

/* The 32 weights k = 32 b .. 32 b + 31 of a row as four vectors (types fused_type() accepts). */
static inline __attribute__((always_inline)) void load32(const uint8_t *row, int qtype, int64_t b,
                                                         __m256 w[4]) {
    if (qtype == T_Q4_0 || qtype == T_Q4_1) {
        const uint8_t *p = row + (qtype == T_Q4_0 ? 18 : 20) * b;
        const uint8_t *qs = p + (qtype == T_Q4_0 ? 2 : 4);
        __m256 vd, vm;
        vd = broadcast_half(p);
        if (qtype == T_Q4_1) {
            vm = broadcast_half(p + 2);
        } else { /* Q4_0: d * (q - 8) = d * q - 8 d, exact, so one FMA gives the reference's value */
            vm = _mm256_mul_ps(vd, _mm256_set1_ps(-8.0f));
        }
        /* Code bytes 0-7 and 8-15 widened to 32 bits straight from memory; each lane then holds
         * element j (low nibble) and element j + 16 (high nibble). 10 instructions per block
         * fewer than splitting the nibbles in one 128-bit register and widening four times. */
        __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
        __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
        __m256i mask = _mm256_set1_epi32(0x0f);
        w[0] = _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), vm);
        w[1] = _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(_mm256_and_si256(c, mask)), vm);
        w[2] = _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), vm);
        w[3] = _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4)), vm);
    } else if (qtype == T_Q8_0) {
        const uint8_t *p = row + 34 * b;
        __m256 vd = broadcast_half(p);
        for (int i = 0; i < 4; i++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(p + 2 + 8 * i));
            w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vd);
        }
    } else if (qtype == T_F32) {
        const float *p = (const float *)row + 32 * b;
        for (int i = 0; i < 4; i++) w[i] = _mm256_loadu_ps(p + 8 * i);
    } else if (qtype == T_BF16) {
        const uint8_t *p = row + 64 * b;
        for (int i = 0; i < 4; i++) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * i)));
            w[i] = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
        }
    } else { /* T_F16 (fused_type() admits it only with F16C) */
#if defined(__F16C__)
        const uint8_t *p = row + 64 * b;
        for (int i = 0; i < 4; i++)
            w[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * i)));
#endif
    }
}

/* One scalar weight k of a float-format row (the tail past the last whole 32). */
static inline float weight_at(const uint8_t *row, int qtype, int64_t k) {
    if (qtype == T_F32) return ((const float *)row)[k];
    if (qtype == T_BF16) return f32_bits((uint32_t)(row[2 * k] | (row[2 * k + 1] << 8)) << 16);
    return half_to_float(row + 2 * k);
}

static inline int fused_type(int qtype) {
    switch (qtype) {
    case T_Q4_0: case T_Q4_1: case T_Q8_0: case T_F32: case T_BF16: return 1;
#if defined(__F16C__)
    case T_F16: return 1;
#endif
    default: return 0;
    }
}

/* out[t] = sum_k W[k] x[t, k] for R (1 to 4) rows x[t] = x + t * xs, decoding each block once
 * for all R rows. One or two rows keep four accumulators per row (short FMA chains); three or
 * four keep two per row (8 chains already, and 4 x 4 accumulators plus the block would not fit
 * in the 16 vector registers), so their sums run in another order than one row's: equal to
 * fp32 rounding, not bitwise. */
static inline __attribute__((always_inline)) void fused_dot(const uint8_t *row, int qtype,
                                                            int64_t K, const float *x, int64_t xs,
                                                            const int R, float *out) {
    const int A = R <= 2 ? 4 : 2; /* accumulators per row */
    __m256 acc[4][4];
    for (int t = 0; t < R; t++)
        for (int i = 0; i < A; i++) acc[t][i] = _mm256_setzero_ps();
    int64_t blocks = K / 32;
    /* bytes per 32 weights (qtype is a constant here: this folds away) */
    const int64_t bb = qtype == T_Q4_0 ? 18 : qtype == T_Q4_1 ? 20 : qtype == T_Q8_0 ? 34
                     : qtype == T_F32 ? 128 : 64;
    for (int64_t b = 0; b < blocks; b++) {
        __m256 w[4];
        __builtin_prefetch(row + b * bb + PREFETCH_BYTES);
        load32(row, qtype, b, w);
        for (int t = 0; t < R; t++) {
            const float *xt = x + t * xs + 32 * b;
            for (int i = 0; i < 4; i++)
                acc[t][i % A] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xt + 8 * i), acc[t][i % A]);
        }
    }
    for (int t = 0; t < R; t++) {
        __m256 s = A == 4 ? _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]),
                                          _mm256_add_ps(acc[t][2], acc[t][3]))
                          : _mm256_add_ps(acc[t][0], acc[t][1]);
        float r = hsum256(s);
        for (int64_t k = 32 * blocks; k < K; k++) r += weight_at(row, qtype, k) * x[t * xs + k];
        out[t] = r;
    }
}

/* y[t * N + n] = W[n] . x[t] (+ bias[n - n0]) for the count rows n = n0 .. n0 + count - 1,
 * stored row_bytes apart from rows (bias: count floats or NULL), and R (1 to 4) x rows. The
 * row loop sits inside the code made for one type and row count, so the per-row cost is the
 * dot product alone (dispatching each row through a call cost ~10% at K = 576). */
static inline __attribute__((always_inline)) void fused_rows(const uint8_t *rows,
                                                             int64_t row_bytes, int64_t count,
                                                             int qtype, int64_t K, const float *x,
                                                             int64_t xs, const int R, float *y,
                                                             int64_t N, int64_t n0,
                                                             const float *bias) {
    for (int64_t r = 0; r < count; r++) {
        float out[4];
        fused_dot(rows + r * row_bytes, qtype, K, x, xs, R, out);
        float b = bias ? bias[r] : 0.0f;
        for (int t = 0; t < R; t++) y[t * N + n0 + r] = out[t] + b;
    }
}

#define FUSED_CASE(Q)                                                                          \
    case Q:                                                                                    \
        switch (R) {                                                                           \
        case 1: fused_rows(rows, row_bytes, count, Q, K, x, xs, 1, y, N, n0, bias); break;     \
        case 2: fused_rows(rows, row_bytes, count, Q, K, x, xs, 2, y, N, n0, bias); break;     \
        case 3: fused_rows(rows, row_bytes, count, Q, K, x, xs, 3, y, N, n0, bias); break;     \
        default: fused_rows(rows, row_bytes, count, Q, K, x, xs, 4, y, N, n0, bias); break;    \
        }                                                                                      \
        return;

/* fused_rows with the type and row count as constants (each case is its own loop). */
static void fused_rows_dispatch(const uint8_t *rows, int64_t row_bytes, int64_t count, int qtype,
                                int64_t K, const float *x, int64_t xs, int R, float *y,
                                int64_t N, int64_t n0, const float *bias) {
    switch (qtype) {
    FUSED_CASE(T_Q4_0) FUSED_CASE(T_Q4_1) FUSED_CASE(T_Q8_0) FUSED_CASE(T_F32) FUSED_CASE(T_BF16)
#if defined(__F16C__)
    FUSED_CASE(T_F16)
#endif
    default: return;
    }
}
#undef FUSED_CASE

/* BF16 rows at 1-4 x rows, the weights read 32 bytes at a time. A 32-bit lane of 16 bf16
 * weights holds weight 2j in its low half and 2j + 1 in its high half, so (lane << 16) and
 * (lane & 0xffff0000) are the fp32 values of the even and the odd weights, exactly: one load
 * and two integer operations per 16 weights, against two widening loads (a load and a shuffle
 * each) and two shifts when load32() takes them in order. The x rows are split the same way
 * once per call (split_even_odd), so weight k still multiplies x[k]. R = 1 keeps 8
 * accumulators (two 32-weight blocks per iteration): with 4, the FMA chains bound a
 * 1152-byte row (K = 576) from cache. Each call prefetches its first BF16_PREFETCH_BYTES up
 * front and the loop runs that far ahead: a decode step is ~120 short calls, and each one's
 * stream started cold. Measured on the bf16 checkpoint of the embedded model (one thread, CPU
 * time, steps alternated): a decode step 0.84x the bf16 column panels' (bf16_weight_linear.c)
 * with load32(), 0.96x with this (benchmarks/results/gguf_weights.md). The sums run in another
 * order than load32()'s path: equal to fp32 rounding, not bitwise. */
#define BF16_SPLIT_MAX_FLOATS 32768 /* R * K at most (128 KiB of split x on the stack) */
#ifndef BF16_PREFETCH_BYTES
#define BF16_PREFETCH_BYTES 8192
#endif

/* xp[t * kp + 32 b + i] for the kp = 32 (K / 32) weights of whole blocks: within each 16,
 * x's even elements, then its odd ones. */
static inline void split_even_odd(const float *x, int64_t xs, int R, int64_t kp, float *xp) {
    for (int t = 0; t < R; t++)
        for (int64_t c = 0; c < kp; c += 16)
            for (int j = 0; j < 8; j++) {
                xp[t * kp + c + j] = x[t * xs + c + 2 * j];
                xp[t * kp + c + 8 + j] = x[t * xs + c + 2 * j + 1];
            }
}

/* acc_even += even weights of the 16 bf16 weights at p * x_even, acc_odd likewise (x_even:
 * 8 floats, then x_odd). Each 32 bytes are loaded and used at once: decoding a whole block
 * into registers before its FMAs ran 10-20% slower from DRAM. */
static inline __attribute__((always_inline)) void bf16_fma16(const uint8_t *p, const float *x,
                                                             __m256 *acc_even, __m256 *acc_odd) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    *acc_even = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_loadu_ps(x),
                                *acc_even);
    *acc_odd = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-65536))),
                               _mm256_loadu_ps(x + 8), *acc_odd);
}

/* out[t] = W . x[t] for one BF16 row and R (1 to 4) x rows, xp their split (kp apart). */
static inline __attribute__((always_inline)) void bf16_split_dot(const uint8_t *row, int64_t K,
                                                                 const float *xp, int64_t kp,
                                                                 const float *x, int64_t xs,
                                                                 const int R, float *out) {
    const int A = R == 1 ? 8 : R == 2 ? 4 : 2; /* accumulators per x row */
    __m256 acc[4][8];
    for (int t = 0; t < R; t++)
        for (int i = 0; i < A; i++) acc[t][i] = _mm256_setzero_ps();
    int64_t blocks = K / 32, b = 0;
    if (R == 1) { /* two blocks an iteration, each into its own 4 accumulators */
        for (; b + 2 <= blocks; b += 2) {
            const uint8_t *p = row + 64 * b;
            __builtin_prefetch(p + BF16_PREFETCH_BYTES);
            __builtin_prefetch(p + 64 + BF16_PREFETCH_BYTES);
            for (int h = 0; h < 4; h++)
                bf16_fma16(p + 32 * h, xp + 32 * b + 16 * h, &acc[0][2 * h], &acc[0][2 * h + 1]);
        }
    }
    for (; b < blocks; b++) {
        const uint8_t *p = row + 64 * b;
        __builtin_prefetch(p + BF16_PREFETCH_BYTES);
        for (int t = 0; t < R; t++)
            for (int h = 0; h < 2; h++)
                bf16_fma16(p + 32 * h, xp + t * kp + 32 * b + 16 * h, &acc[t][(2 * h) % A],
                           &acc[t][(2 * h + 1) % A]);
    }
    for (int t = 0; t < R; t++) {
        for (int i = 4; i < A; i++) acc[t][i - 4] = _mm256_add_ps(acc[t][i - 4], acc[t][i]);
        __m256 s = A >= 4 ? _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]),
                                          _mm256_add_ps(acc[t][2], acc[t][3]))
                          : _mm256_add_ps(acc[t][0], acc[t][1]);
        float r = hsum256(s);
        for (int64_t k = 32 * blocks; k < K; k++) r += weight_at(row, T_BF16, k) * x[t * xs + k];
        out[t] = r;
    }
}

/* fused_rows() for BF16 rows on split x rows. */
static inline __attribute__((always_inline)) void bf16_split_rows(
    const uint8_t *rows, int64_t row_bytes, int64_t count, int64_t K, const float *xp, int64_t kp,
    const float *x, int64_t xs, const int R, float *y, int64_t N, int64_t n0, const float *bias) {
    for (int64_t r = 0; r < count; r++) {
        float out[4];
        bf16_split_dot(rows + r * row_bytes, K, xp, kp, x, xs, R, out);
        float b = bias ? bias[r] : 0.0f;
        for (int t = 0; t < R; t++) y[t * N + n0 + r] = out[t] + b;
    }
}

/* The BF16 rows of fused_rows_dispatch() on the split path; 0 when R * K is past the split
 * buffer (the caller then takes fused_rows_dispatch). */
static int bf16_rows_split(const uint8_t *rows, int64_t row_bytes, int64_t count, int64_t K,
                           const float *x, int64_t xs, int R, float *y, int64_t N, int64_t n0,
                           const float *bias) {
    if (R < 1 || R > FUSED_MAX_ROWS || (int64_t)R * K > BF16_SPLIT_MAX_FLOATS) return 0;
    int64_t kp = K / 32 * 32;
    float xp[R * kp + 8] __attribute__((aligned(64)));
    /* The stream's first lines, before the loop's prefetches reach past them. */
    for (int64_t o = 0; o < BF16_PREFETCH_BYTES && o < count * row_bytes; o += 64)
        __builtin_prefetch(rows + o);
    split_even_odd(x, xs, R, kp, xp);
    switch (R) {
    case 1: bf16_split_rows(rows, row_bytes, count, K, xp, kp, x, xs, 1, y, N, n0, bias); break;
    case 2: bf16_split_rows(rows, row_bytes, count, K, xp, kp, x, xs, 2, y, N, n0, bias); break;
    case 3: bf16_split_rows(rows, row_bytes, count, K, xp, kp, x, xs, 3, y, N, n0, bias); break;
    default: bf16_split_rows(rows, row_bytes, count, K, xp, kp, x, xs, 4, y, N, n0, bias); break;
    }
    return 1;
}

/* out[t] = w . x[t] for 4 rows x[t] = x + t * xs: each 8 weights loaded once for the 4 rows
 * (the buffered path's dot products are bound by loads: 5 loads per 4 FMAs instead of 8). */
static void dot_rows4(const float *restrict w, const float *restrict x, int64_t xs, int64_t K,
                      float *out) {
    __m256 acc[4][2];
    for (int t = 0; t < 4; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
        for (int t = 0; t < 4; t++) {
            acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * xs + k), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * xs + k + 8), acc[t][1]);
        }
    }
    for (int t = 0; t < 4; t++) {
        float s = hsum256(_mm256_add_ps(acc[t][0], acc[t][1]));
        for (int64_t j = k; j < K; j++) s += w[j] * x[t * xs + j];
        out[t] = s;
    }
}
#endif

/* y[t * N + n] = W[n] . x[t] (+ b) for every t < T: one weight row, read once.
 * buf: K floats (the dequantised row, when the fused path does not apply). */
static void project_row(const uint8_t *row, int qtype, int64_t K, const float *x, int64_t T,
                        int64_t xs, float *buf, float *y, int64_t N, int64_t n, float b) {
#if defined(__AVX2__) && defined(__FMA__)
    if (T <= FUSED_MAX_ROWS && fused_type(qtype)) {
        fused_rows_dispatch(row, 0, 1, qtype, K, x, xs, (int)T, y, N, n, &b);
        return;
    }
#endif
    dequant_row(row, qtype, K, buf);
    int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; t + 4 <= T; t += 4) {
        float out[4];
        dot_rows4(buf, x + t * xs, xs, K, out);
        for (int i = 0; i < 4; i++) y[(t + i) * N + n] = out[i] + b;
    }
#endif
    for (; t < T; t++) y[t * N + n] = dot(buf, x + t * xs, K) + b;
}

/* project_row() for the count consecutive rows n0 .. n0 + count - 1 of one format, stored
 * row_bytes apart from rows (bias: N floats or NULL). */
static void project_rows(const uint8_t *rows, int64_t row_bytes, int64_t count, int qtype,
                         int64_t K, const float *x, int64_t T, int64_t xs, float *buf, float *y,
                         int64_t N, int64_t n0, const float *bias) {
#if defined(__AVX2__) && defined(__FMA__)
    if (T <= FUSED_MAX_ROWS && qtype == T_BF16 &&
        bf16_rows_split(rows, row_bytes, count, K, x, xs, (int)T, y, N, n0,
                        bias ? bias + n0 : NULL))
        return;
    if (T <= FUSED_MAX_ROWS && fused_type(qtype)) {
        fused_rows_dispatch(rows, row_bytes, count, qtype, K, x, xs, (int)T, y, N, n0,
                            bias ? bias + n0 : NULL);
        return;
    }
#endif
    for (int64_t r = 0; r < count; r++)
        project_row(rows + r * row_bytes, qtype, K, x, T, xs, buf, y, N, n0 + r,
                    bias ? bias[n0 + r] : 0.0f);
}

/* Whether a product of T x rows with the segmented weight seg (int64 count, then (qtype, rows,
 * row_bytes) per segment) runs on the row paths (project_rows): one or two rows always, up to
 * FUSED_MAX_ROWS when every segment's format decodes in registers; more go to the panels of
 * gguf_panel.h (dequantised once per 12 rows into a tile, then a register-blocked kernel). */
static inline int few_row_product(const int64_t *seg, int64_t T) {
    if (T <= 2) return 1;
#if defined(__AVX2__) && defined(__FMA__)
    if (T > FUSED_MAX_ROWS) return 0;
    for (int64_t s = 0; s < seg[0]; s++)
        if (!fused_type((int)seg[1 + 3 * s])) return 0;
    return 1;
#else
    return 0;
#endif
}

/* This thread's share [*lo, *hi) of n rows in an OpenMP parallel region (all of them outside
 * one): contiguous and balanced like schedule(static), so project_rows() can take it whole. */
static inline void thread_share(int64_t n, int64_t *lo, int64_t *hi) {
#if defined(_OPENMP)
    int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
#else
    int64_t t = 0, threads = 1;
#endif
    *lo = n * t / threads;
    *hi = n * (t + 1) / threads;
}

#endif /* DEEPINFER_GGUF_BLOCKS_H */
