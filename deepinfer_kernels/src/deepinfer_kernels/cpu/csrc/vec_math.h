/* Vectorised fp32 math for the CPU kernels (a header of static functions).
 *
 * expf_inplace(v, n) sets v[i] = e^v[i]. With AVX2 + FMA it runs 8 lanes at a time (expf8,
 * the tail too); elsewhere it calls libm's expf, so other CPUs get exactly the values they had. expf8 is within 2 ulp of the correctly rounded e^x for every finite x (1 ulp on the
 * normal range; test_cpu_vec_math.py sweeps it against float64 exp), exp(-inf) = 0,
 * exp(+inf) = +inf, NaN stays NaN, overflow gives +inf and underflow 0 or a subnormal.
 *
 * Why: the decode attention takes one exp per score and SiLU one per intermediate value; libm's
 * scalar expf is a call of ~20 cycles each, 8-10% of a SmolLM2 decode step on one core.
 *
 * How: x = n ln2 + r with n = round(x / ln2) and r in [-ln2/2, ln2/2] (ln2 split in two, so
 * r is exact to ~2^-35), e^r = 1 + r + r^2 P(r) with P Cephes' degree-5 minimax polynomial,
 * then e^x = e^r 2^n1 2^n2 with n1 + n2 = n, two normal powers of two, so results down to the
 * subnormals round once from e^r.
 */
#ifndef DEEPINFER_VEC_MATH_H
#define DEEPINFER_VEC_MATH_H

#include <math.h>
#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline __m256 expf8(__m256 x) {
    /* exp(88.7228394) overflows and exp(-104) rounds to 0: clamping changes nothing beyond. */
    const __m256 hi = _mm256_set1_ps(88.72283935546875f), lo = _mm256_set1_ps(-104.0f);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    /* n in [-150, 128]: two halves, each a normal power of two. */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(e, s1), s2);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); /* NaN in, NaN out */
}
#endif

/* v[i] = e^v[i] for i < n (see the file comment for the accuracy). A value's result does not
 * depend on where it sits in v: the tail runs through expf8 too. */
static inline void expf_inplace(float *v, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, expf8(_mm256_loadu_ps(v + i)));
    if (i < n) {
        float tail[8] = {0};
        for (int64_t j = i; j < n; j++) tail[j - i] = v[j];
        _mm256_storeu_ps(tail, expf8(_mm256_loadu_ps(tail)));
        for (int64_t j = i; j < n; j++) v[j] = tail[j - i];
    }
#else
    for (; i < n; i++) v[i] = expf(v[i]);
#endif
}

#endif /* DEEPINFER_VEC_MATH_H */
