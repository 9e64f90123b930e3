/* Paged attention of short query tiles (decode, verification) over an fp32 paged KV cache.
 *
 * For tile t, KV head h, padded query row r and group member g (query head h * G + g):
 *
 *   s_j = scale * q . k_j                      for keys j < key_len with keep[t, r, j]
 *   s_j = cap * tanh(s_j / cap)                (soft_cap > 0)
 *   o   = sum_j (exp(s_j - m) / l) v_j,  m = max_j s_j,   l = sum_j exp(s_j - m)
 *   lse = m + log(l)                           (o = 0, lse = -inf when no key is kept)
 *
 * Key j of tile t is slot j % block_size of page page_ids[t * num_pages + j / block_size];
 * q row r of tile t is q_rows[t * max_q + r] (or row_start + t * max_q + r without q_rows).
 * Layouts: q [total_q, Hq, D] with rows q_stride elements apart (a view of a fused QKV
 * projection), the rest contiguous: caches [num_blocks, block_size, Hkv, D],
 * keep [num_tiles, max_q, key_len] bytes or NULL (all kept), o [num_tiles * max_q, Hq, D],
 * lse [num_tiles * max_q, Hq] or NULL.
 *
 * Why: the torch path gathers the pages and calls SDPA once per layer; for a few short tiles
 * that is a handful of ops whose fixed costs (~0.3 ms for 16 decode rows) exceed the
 * arithmetic many times over.
 *
 * How:
 * - A work item is (tile, key span). It reads each key's K row and then each V row of all KV
 *   heads as one contiguous read (a page is block_size such rows), for all max_q * Hq query
 *   rows of the tile, straight from the pages, and keeps its softmax unnormalised per row:
 *   (m, l, sum_j e^(s_j - m) v_j). Reading one KV head at a time instead (stride Hkv * D)
 *   ran at about a third of the memory bandwidth on long contexts.
 * - Items are split between the OpenMP threads of the caller. With fewer tiles than twice
 *   the threads (a lone decode, a verification tile) the keys are split into spans of at
 *   least MIN_SPAN_KEYS too, and the spans' partial softmaxes are merged exactly:
 *   M = max_s m_s, L = sum_s e^(m_s - M) l_s, o = sum_s e^(m_s - M) o_s / L, lse = M + log L.
 * - Dot products and value sums run 16 lanes wide (vector extensions) when D is a multiple
 *   of 16, with a fixed lane-summation order. The exponentials of a row's scores run 8 lanes
 *   wide (vec_math.h: within 2 ulp of expf; libm's expf, one call per score, was ~8% of a
 *   decode step).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "vec_math.h"

typedef float f32x16 __attribute__((vector_size(64)));
typedef float f32x16_any __attribute__((vector_size(64), aligned(4)));

#define MIN_SPAN_KEYS 32 /* fewer keys per span do not pay for a merge */

static inline float dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float s = 0.f;
    if (n % 16 == 0) {
        f32x16 acc = {0};
        for (; i < n; i += 16) acc += *(const f32x16_any *)(a + i) * *(const f32x16_any *)(b + i);
        /* Pairwise lane sum in vector halves: the same order on every call. */
        typedef float f32x8 __attribute__((vector_size(32)));
        typedef float f32x4 __attribute__((vector_size(16)));
        f32x8 a8 = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
        f32x4 a4 = __builtin_shufflevector(a8, a8, 0, 1, 2, 3) +
                   __builtin_shufflevector(a8, a8, 4, 5, 6, 7);
        return (a4[0] + a4[2]) + (a4[1] + a4[3]);
    }
    float acc[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
    if (n % 16 == 0) {
        f32x16 av = {a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a};
        for (; i < n; i += 16)
            *(f32x16_any *)(y + i) += av * *(const f32x16_any *)(x + i);
        return;
    }
    for (; i < n; i++) y[i] += a * x[i];
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TILE_SIMD 1

/* The 8 dot products q . k[i] (i < 8) of length d (a multiple of 8), as one vector: per key 8
 * lanes accumulated, then the 8 vectors reduced together (7 adds and a shuffle for all 8,
 * where reducing each alone took ~8 instructions per key). */
static inline __m256 dots8(const float *q, const float *const k[8], int64_t d) {
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t e = 0; e < d; e += 8) {
        __m256 qv = _mm256_loadu_ps(q + e);
        for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[i] + e), acc[i]);
    }
    __m256 a01 = _mm256_hadd_ps(acc[0], acc[1]), a23 = _mm256_hadd_ps(acc[2], acc[3]);
    __m256 a45 = _mm256_hadd_ps(acc[4], acc[5]), a67 = _mm256_hadd_ps(acc[6], acc[7]);
    __m256 a0123 = _mm256_hadd_ps(a01, a23), a4567 = _mm256_hadd_ps(a45, a67);
    /* a0123 = [k0 k1 k2 k3 | k0 k1 k2 k3] halves (low lanes, high lanes): add the halves. */
    __m256 lo = _mm256_permute2f128_ps(a0123, a4567, 0x20);
    __m256 hi = _mm256_permute2f128_ps(a0123, a4567, 0x31);
    return _mm256_add_ps(lo, hi);
}

/* o[:d] += sum_i p[i] v[i][off:off + d] over n keys, o's 64-float chunks held in registers
 * across the keys (one load and one FMA per 8 values, where an axpy per key also loaded and
 * stored o). */
static inline void weighted_sum(float *o, const float *p, const float *const *v, int64_t off,
                                int64_t n, int64_t d) {
    for (int64_t e0 = 0; e0 < d; e0 += 64) {
        int chunks = (int)((d - e0 < 64 ? d - e0 : 64) / 8);
        __m256 acc[8];
        for (int c = 0; c < chunks; c++) acc[c] = _mm256_loadu_ps(o + e0 + 8 * c);
        for (int64_t i = 0; i < n; i++) {
            if (p[i] == 0.f) continue; /* masked keys (and exp underflow) add nothing */
            __m256 pv = _mm256_set1_ps(p[i]);
            const float *vi = v[i] + off + e0;
            for (int c = 0; c < chunks; c++)
                acc[c] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vi + 8 * c), acc[c]);
        }
        for (int c = 0; c < chunks; c++) _mm256_storeu_ps(o + e0 + 8 * c, acc[c]);
    }
}
#else
#define TILE_SIMD 0
#endif

/* One item: keys [j0, j1) of tile t for all its max_q * Hq query rows (rr = r * Hq + head).
 * Writes per row m[rr], l[rr] and the unnormalised o[rr][:]. Each key's K (then V) row of all
 * KV heads is one contiguous read. scores: rows * span floats; keys: span pointers. With AVX2
 * and D a multiple of 8 the scores of 8 keys are computed together and each row's value sum
 * keeps its output in registers (the same sums, in another order). */
static void attend_span(const float *q, int64_t q_stride, const int64_t *q_rows,
                        int64_t row_start, const float *k_cache, const float *v_cache,
                        const int64_t *pages, const uint8_t *keep, int64_t t, int64_t j0,
                        int64_t j1, int64_t max_q, int64_t key_len, int64_t block_size,
                        int64_t hq, int64_t hkv, int64_t d, float scale, float soft_cap,
                        float *m, float *l, float *o, float *scores, const float **keys,
                        int64_t *hi) {
    int64_t span = j1 - j0, rows = max_q * hq, group = hq / hkv, row_len = hkv * d;
    /* hi[r]: one past row r's last kept key of the span. Keys from there on are masked, so
     * their scores, exponentials and values are skipped: a causal prefill tile (many
     * sequences' prompts in one batch) computes its kept half only, not the whole square. */
    for (int64_t r = 0; r < max_q; r++) {
        const uint8_t *kr = keep ? keep + (t * max_q + r) * key_len + j0 : NULL;
        int64_t h = span;
        if (kr)
            while (h > 0 && !kr[h - 1]) h--;
        hi[r] = h;
    }
    for (int64_t rr = 0; rr < rows; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.f;
    }
    memset(o, 0, (size_t)(rows * d) * sizeof(float));
    int simd = TILE_SIMD && d % 8 == 0;
    (void)simd; /* unused without AVX2 */
    int64_t jj = 0;
#if TILE_SIMD
    if (simd) {
        for (; jj + 8 <= span; jj += 8) {
            const float *kk[8];
            for (int i = 0; i < 8; i++) {
                int64_t j = j0 + jj + i;
                kk[i] = k_cache + (pages[j / block_size] * block_size + j % block_size) * row_len;
            }
            for (int64_t r = 0; r < max_q; r++) {
                if (jj >= hi[r]) continue; /* every key of the 8 is masked for this row */
                int64_t out_row = t * max_q + r;
                int64_t q_row = q_rows ? q_rows[out_row] : row_start + out_row;
                const float *qr = q + q_row * q_stride;
                for (int64_t x = 0; x < hq; x++) {
                    const float *kh[8];
                    for (int i = 0; i < 8; i++) kh[i] = kk[i] + (x / group) * d;
                    _mm256_storeu_ps(scores + (r * hq + x) * span + jj,
                                     _mm256_mul_ps(_mm256_set1_ps(scale), dots8(qr + x * d, kh, d)));
                }
            }
        }
    }
#endif
    for (; jj < span; jj++) { /* the rest one key at a time */
        int64_t j = j0 + jj;
        const float *kj = k_cache + (pages[j / block_size] * block_size + j % block_size) * row_len;
        for (int64_t r = 0; r < max_q; r++) {
            if (jj >= hi[r]) continue;
            int64_t out_row = t * max_q + r;
            int64_t q_row = q_rows ? q_rows[out_row] : row_start + out_row;
            const float *qr = q + q_row * q_stride;
            for (int64_t x = 0; x < hq; x++)
                scores[(r * hq + x) * span + jj] = scale * dot(qr + x * d, kj + (x / group) * d, d);
        }
    }
    /* Soft cap, masks and each row's maximum. */
    for (int64_t r = 0; r < max_q; r++) {
        int64_t out_row = t * max_q + r;
        const uint8_t *kr = keep ? keep + out_row * key_len + j0 : NULL;
        for (int64_t x = 0; x < hq; x++) {
            float *sr = scores + (r * hq + x) * span, big = -INFINITY;
            for (int64_t i = 0; i < hi[r]; i++) {
                float sc = sr[i];
                if (soft_cap > 0) sc = soft_cap * tanhf(sc / soft_cap);
                if (kr && !kr[i]) sc = -INFINITY;
                sr[i] = sc;
                if (sc > big) big = sc;
            }
            m[r * hq + x] = big;
        }
    }
    for (int64_t rr = 0; rr < rows; rr++) {
        if (m[rr] == -INFINITY) continue; /* no key of the span is kept */
        float *sr = scores + rr * span, sum = 0.f;
        int64_t n = hi[rr / hq];
        for (int64_t i = 0; i < n; i++) sr[i] -= m[rr];
        expf_inplace(sr, n); /* vec_math.h; exp(-inf) = 0 for masked keys */
        for (int64_t i = 0; i < n; i++) sum += sr[i];
        for (int64_t i = n; i < span; i++) sr[i] = 0.f; /* masked: the scalar value sum reads them */
        l[rr] = sum;
    }
#if TILE_SIMD
    if (simd) {
        for (int64_t i = 0; i < span; i++) {
            int64_t j = j0 + i;
            keys[i] = v_cache + (pages[j / block_size] * block_size + j % block_size) * row_len;
        }
        for (int64_t rr = 0; rr < rows; rr++) {
            if (m[rr] == -INFINITY) continue;
            weighted_sum(o + rr * d, scores + rr * span, keys, ((rr % hq) / group) * d,
                         hi[rr / hq], d);
        }
        return;
    }
#endif
    (void)keys;
    for (int64_t i = 0; i < span; i++) {
        int64_t j = j0 + i;
        const float *vj = v_cache + (pages[j / block_size] * block_size + j % block_size) * row_len;
        for (int64_t rr = 0; rr < rows; rr++) {
            float p = scores[rr * span + i];
            if (p != 0.f) axpy(o + rr * d, p, vj + ((rr % hq) / group) * d, d);
        }
    }
}

/* Returns 0, or -1 when a scratch buffer cannot be allocated. */
int deepinfer_paged_attention_tiles(const float *q, int64_t q_stride, const int64_t *q_rows,
                                    int64_t row_start,
                                    const float *k_cache, const float *v_cache,
                                    const int64_t *page_ids, const uint8_t *keep, float *o,
                                    float *lse, int64_t num_tiles, int64_t max_q,
                                    int64_t num_pages, int64_t key_len, int64_t block_size,
                                    int64_t hq, int64_t hkv, int64_t d, float scale,
                                    float soft_cap) {
    int64_t rows = max_q * hq;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    int64_t spans = 1;
    if (num_tiles < 2 * threads && key_len >= 2 * MIN_SPAN_KEYS) {
        spans = (2 * threads + num_tiles - 1) / num_tiles;
        if (spans > key_len / MIN_SPAN_KEYS) spans = key_len / MIN_SPAN_KEYS;
    }
    int64_t per_span = (key_len + spans - 1) / spans;
    if (per_span < 1) per_span = 1;
    int64_t items = num_tiles * spans;
    /* Partial softmaxes of every item: m, l [items][rows], o [items][rows][d]. With one span a
     * tile, item t's o is exactly tile t's rows of the output ([t][r][head][d] either way), so it
     * is written there and normalised in place: a 16-prompt prefill's separate o buffer (3 MB)
     * was mapped and faulted in afresh by every call (700 page faults, +40% of the call). */
    int direct = spans == 1;
    float *part = malloc((size_t)(items * rows * (direct ? 2 : d + 2)) * sizeof(float));
    if (!part) return -1;
    float *pm = part, *pl = pm + items * rows, *po = direct ? o : pl + items * rows;
    int failed = 0;
#pragma omp parallel
    {
        float *scores = malloc((size_t)(rows * per_span) * sizeof(float));
        const float **keys = malloc((size_t)per_span * sizeof(float *));
        int64_t *hi = malloc((size_t)max_q * sizeof(int64_t));
        if (!scores || !keys || !hi) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            if (!scores || !keys || !hi) continue;
            int64_t t = it / spans, s = it % spans;
            int64_t j0 = s * per_span, j1 = j0 + per_span < key_len ? j0 + per_span : key_len;
            if (j0 > j1) j0 = j1;
            attend_span(q, q_stride, q_rows, row_start, k_cache, v_cache,
                        page_ids + t * num_pages, keep, t, j0, j1, max_q, key_len, block_size,
                        hq, hkv, d, scale, soft_cap, pm + it * rows, pl + it * rows,
                        po + it * rows * d, scores, keys, hi);
        }
        free(scores);
        free(keys);
        free(hi);
    }
    if (failed) {
        free(part);
        return -1;
    }
    if (direct) { /* the merge below with one span: o / l, bit for bit */
        for (int64_t it = 0; it < items * rows; it++) {
            float *out = o + it * d;
            if (pm[it] == -INFINITY) { /* no key kept: o = 0 (the scalar value sum wrote -inf) */
                for (int64_t e = 0; e < d; e++) out[e] = 0.f;
                if (lse) lse[it] = -INFINITY;
                continue;
            }
            float inv = 1.f / pl[it];
            for (int64_t e = 0; e < d; e++) out[e] *= inv;
            if (lse) lse[it] = pm[it] + logf(pl[it]);
        }
        free(part);
        return 0;
    }
    /* Merge the spans of each tile and normalise. */
    for (int64_t t = 0; t < num_tiles; t++) {
        for (int64_t rr = 0; rr < rows; rr++) {
            int64_t out_row = t * max_q + rr / hq, head = rr % hq;
            float *out = o + (out_row * hq + head) * d;
            float big = -INFINITY;
            for (int64_t s = 0; s < spans; s++) {
                float ms = pm[(t * spans + s) * rows + rr];
                if (ms > big) big = ms;
            }
            for (int64_t e = 0; e < d; e++) out[e] = 0.f;
            if (big == -INFINITY) {
                if (lse) lse[out_row * hq + head] = -INFINITY;
                continue;
            }
            float total = 0.f;
            for (int64_t s = 0; s < spans; s++) {
                int64_t it = t * spans + s;
                float ms = pm[it * rows + rr];
                if (ms == -INFINITY) continue;
                float w = expf(ms - big);
                total += w * pl[it * rows + rr];
                axpy(out, w, po + (it * rows + rr) * d, d);
            }
            float inv = 1.f / total;
            for (int64_t e = 0; e < d; e++) out[e] *= inv;
            if (lse) lse[out_row * hq + head] = big + logf(total);
        }
    }
    free(part);
    return 0;
}

/* This file's entry of the signature table (deepinfer_kernels/cpu/sources.py): the loader
 * compares the two and refuses the library when they differ. */
const char *deepinfer_abi_paged_attention_tiles(void) { return "1|deepinfer_paged_attention_tiles(pipippppppiiiiiiiiff)i"; }
