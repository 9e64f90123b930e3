/* The two halves of a Llama decoder layer around its attention, for a few rows (T <= 32).
 *
 * deepinfer_decoder_qkv, for rows t < T of the normed input x [T, H]:
 *
 *   qkv  = x Wqkv^T (+ b)                                  [T, (Hq + 2 Hkv) D]
 *   q, k = rope(q), rope(k)   per head, with the full-width tables of RotaryEmbedding.cos_sin:
 *          y_i = x_i cos_i + x_{(i + D/2) mod D} sin_i      (sin = [-sin a, sin a])
 *   k_cache[slots[t]] = k_t,  v_cache[slots[t]] = v_t       (caches [slots, Hkv, D])
 *
 * deepinfer_decoder_mlp, given the attention output a [T, Hq D]:
 *
 *   r        = residual + a Wo^T
 *   n        = rmsnorm(r) * post_w
 *   m        = silu(n Wg^T) * (n Wu^T)                     (gate and up fused: Wgu = [Wg; Wu])
 *   residual = r + m Wd^T                                  (in place)
 *   normed   = rmsnorm(residual) * next_w                  (the next layer's input norm)
 *
 * silu(g) = g / (1 + exp(-g)); rmsnorm as in add_rms_norm.c. Weights are bf16 panels
 * (bf16_weight_linear.c), arithmetic fp32, so results equal the layer's torch ops up to fp32
 * rounding.
 *
 * Why: in a decode step each of these ops costs a few microseconds of arithmetic and tens of
 * microseconds of dispatch from Python; a layer was about fifteen torch ops and six kernel
 * calls, and their fixed costs were half the step. Here a layer is two calls around the
 * attention. The products split their panels between the caller's OpenMP threads; the
 * element-wise work is a few thousand values and stays on the calling thread.
 */
#include <math.h>
#include <stdint.h>

#include "add_rms_norm.c"
#include "bf16_weight_linear.c"
#include "rope_kv_write.c"

void deepinfer_decoder_qkv(const float *x, const uint16_t *panels, const float *bias, float *qkv,
                           const float *cos, const float *sin, const int64_t *slots,
                           float *k_cache, float *v_cache, int64_t T, int64_t H, int64_t hq,
                           int64_t hkv, int64_t d) {
    int64_t width = (hq + 2 * hkv) * d;
    deepinfer_bf16_weight_linear(x, panels, bias, qkv, T, width, H);
    rope_and_write_kv(qkv, cos, sin, slots, k_cache, v_cache, T, hq, hkv, d);
}

/* scratch: T * (2 H + 3 I) floats. */
void deepinfer_decoder_mlp(const float *attn, const uint16_t *o_panels, float *residual,
                           float *normed, const float *post_w, const uint16_t *gate_up_panels,
                           const uint16_t *down_panels, const float *next_w, float eps,
                           float *scratch, int64_t T, int64_t H, int64_t Q, int64_t I) {
    float *delta = scratch;
    float *gate_up = delta + T * H;
    float *act = gate_up + T * 2 * I;
    float *down = act + T * I;
    deepinfer_bf16_weight_linear(attn, o_panels, 0, delta, T, H, Q);
    deepinfer_add_rms_norm(residual, delta, post_w, residual, normed, T, H, eps);
    deepinfer_bf16_weight_linear(normed, gate_up_panels, 0, gate_up, T, 2 * I, H);
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * 2 * I, *u = g + I;
        float *m = act + t * I;
        for (int64_t i = 0; i < I; i++) m[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
    }
    deepinfer_bf16_weight_linear(act, down_panels, 0, down, T, H, I);
    deepinfer_add_rms_norm(residual, down, next_w, residual, normed, T, H, eps);
}

/* This file's entry of the signature table (deepinfer_kernels/cpu/sources.py): the loader
 * compares the two and refuses the library when they differ. */
const char *deepinfer_abi_decoder_layer(void) { return "1|deepinfer_decoder_qkv(pppppppppiiiii)v|deepinfer_decoder_mlp(ppppppppfpiiii)v"; }
