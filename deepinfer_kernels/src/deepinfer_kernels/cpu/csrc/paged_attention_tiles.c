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
 * arithmetic many times over. Here each (tile, KV head) reads its keys and values once for all
 * G heads of its group, straight from the pages; the weights p are normalised before the sum
 * over values. (tile, KV head) pairs are split between the OpenMP threads of the caller.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline float dot(const float *a, const float *b, int64_t n) {
    /* Eight partial sums, so the compiler can vectorise without reassociating one sum. */
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
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
    int64_t group = hq / hkv;
    int64_t keys = key_len > 0 ? key_len : 1;
    int failed = 0;
#pragma omp parallel
    {
        /* Per thread: each key's row offset in the caches, and the group's scores. */
        int64_t *offset = malloc((size_t)keys * sizeof(int64_t));
        float *scores = malloc((size_t)(keys * group) * sizeof(float));
        if (!offset || !scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static) collapse(2)
        for (int64_t t = 0; t < num_tiles; t++) {
            for (int64_t h = 0; h < hkv; h++) {
                if (!offset || !scores) continue;
                const int64_t *pages = page_ids + t * num_pages;
                for (int64_t j = 0; j < key_len; j++)
                    offset[j] = ((pages[j / block_size] * block_size + j % block_size) * hkv + h) * d;
                for (int64_t r = 0; r < max_q; r++) {
                    int64_t out_row = t * max_q + r;
                    int64_t q_row = q_rows ? q_rows[out_row] : row_start + out_row;
                    const uint8_t *kept = keep ? keep + (t * max_q + r) * key_len : NULL;
                    const float *qh = q + q_row * q_stride + h * group * d;  /* the group's queries */
                    float *oh = o + (out_row * hq + h * group) * d;
                    float *lh = lse ? lse + out_row * hq + h * group : NULL;
                    int any = 0;
                    for (int64_t j = 0; j < key_len; j++) {
                        if (kept && !kept[j]) continue;
                        any = 1;
                        const float *kj = k_cache + offset[j];
                        for (int64_t g = 0; g < group; g++) {
                            float sc = scale * dot(qh + g * d, kj, d);
                            if (soft_cap > 0) sc = soft_cap * tanhf(sc / soft_cap);
                            scores[g * keys + j] = sc;
                        }
                    }
                    for (int64_t e = 0; e < group * d; e++) oh[e] = 0.f;
                    if (!any) {
                        if (lh)
                            for (int64_t g = 0; g < group; g++) lh[g] = -INFINITY;
                        continue;
                    }
                    for (int64_t g = 0; g < group; g++) {
                        float *sg = scores + g * keys;
                        float m = -INFINITY, l = 0.f;
                        for (int64_t j = 0; j < key_len; j++)
                            if ((!kept || kept[j]) && sg[j] > m) m = sg[j];
                        for (int64_t j = 0; j < key_len; j++) {
                            float p = (!kept || kept[j]) ? expf(sg[j] - m) : 0.f;
                            sg[j] = p;
                            l += p;
                        }
                        for (int64_t j = 0; j < key_len; j++) sg[j] /= l;
                        if (lh) lh[g] = m + logf(l);
                    }
                    for (int64_t j = 0; j < key_len; j++) {
                        if (kept && !kept[j]) continue;
                        const float *vj = v_cache + offset[j];
                        for (int64_t g = 0; g < group; g++) {
                            float p = scores[g * keys + j];
                            float *og = oh + g * d;
                            for (int64_t e = 0; e < d; e++) og[e] += p * vj[e];
                        }
                    }
                }
            }
        }
        free(offset);
        free(scores);
    }
    return failed ? -1 : 0;
}
