/* RoPE on the Q and K heads of a QKV row and the K/V write into the paged caches (shared by
 * the decoder-layer kernels: decoder_layer.c over bf16 panels, quant_decoder_layer.c over GGUF
 * blocks). Static functions: each including library gets its own copy.
 *
 *   y_i = x_i cos_i + x_{(i + D/2) mod D} sin_i      (sin = [-sin a, sin a], full-width tables)
 *   k_cache[slots[t]] = k_t,  v_cache[slots[t]] = v_t (caches [slots, Hkv, D])
 */
#ifndef DEEPINFER_ROPE_KV_WRITE_C
#define DEEPINFER_ROPE_KV_WRITE_C

#include <stdint.h>

static void rotate_heads(float *row, const float *cos, const float *sin, int64_t heads, int64_t d) {
    int64_t half = d / 2;
    float tmp[d];
    for (int64_t h = 0; h < heads; h++) {
        float *x = row + h * d;
        for (int64_t i = 0; i < d; i++) tmp[i] = x[i];
        for (int64_t i = 0; i < d; i++) {
            float a = tmp[i] * cos[i];
            float b = tmp[(i + half) % d] * sin[i];
            x[i] = a + b;
        }
    }
}

/* Rotate the Q and K heads of every row of qkv [T, (hq + 2 hkv) d] and write K and V. */
static void rope_and_write_kv(float *qkv, const float *cos, const float *sin, const int64_t *slots,
                              float *k_cache, float *v_cache, int64_t T, int64_t hq, int64_t hkv,
                              int64_t d) {
    int64_t width = (hq + 2 * hkv) * d;
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * width;
        /* Q and K heads are adjacent and share the row's angles. */
        rotate_heads(row, cos + t * d, sin + t * d, hq + hkv, d);
        float *k = row + hq * d, *v = k + hkv * d;
        float *kc = k_cache + slots[t] * hkv * d, *vc = v_cache + slots[t] * hkv * d;
        for (int64_t e = 0; e < hkv * d; e++) {
            kc[e] = k[e];
            vc[e] = v[e];
        }
    }
}

#endif /* DEEPINFER_ROPE_KV_WRITE_C */
