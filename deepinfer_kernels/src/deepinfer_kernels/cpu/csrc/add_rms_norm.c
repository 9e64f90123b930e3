/* Residual add fused with the RMSNorm that follows it, per row of H values:
 *
 *   r   = residual + delta                (r = residual when delta is NULL)
 *   out = (r * (1 / sqrt(mean(r^2) + eps))) * weight
 *
 * in fp32, in the order Hugging Face's LlamaRMSNorm rounds (normalise, then scale). r is
 * written to residual_out unless that is NULL (no delta).
 *
 * Why: in a decode step the add and the norm are six small torch ops on a few rows, each
 * paying dispatch and a trip through caches that the weight stream has just flushed; one call
 * reads the rows once. Rows are few and short, so it runs on the calling thread.
 */
#include <math.h>
#include <stdint.h>

typedef float f32x16 __attribute__((vector_size(64)));
typedef float f32x16_any __attribute__((vector_size(64), aligned(4)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));

static inline float hsum(f32x16 v) {
    f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
              __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

void deepinfer_add_rms_norm(const float *residual, const float *delta, const float *weight,
                            float *residual_out, float *out, int64_t M, int64_t H, float eps) {
    int64_t H16 = H - H % 16;
    for (int64_t m = 0; m < M; m++) {
        const float *src = residual + m * H;
        float *r = delta ? residual_out + m * H : (float *)src;
        f32x16 acc = {0};
        int64_t h = 0;
        for (; h < H16; h += 16) {
            f32x16 v = *(const f32x16_any *)(src + h);
            if (delta) {
                v += *(const f32x16_any *)(delta + m * H + h);
                *(f32x16_any *)(r + h) = v;
            }
            acc += v * v;
        }
        float sum = hsum(acc);
        for (; h < H; h++) {
            float v = src[h];
            if (delta) {
                v += delta[m * H + h];
                r[h] = v;
            }
            sum += v * v;
        }
        float inv = 1.0f / sqrtf(sum / (float)H + eps);
        float *o = out + m * H;
        for (h = 0; h < H16; h += 16)
            *(f32x16_any *)(o + h) =
                (*(const f32x16_any *)(r + h) * inv) * *(const f32x16_any *)(weight + h);
        for (; h < H; h++) o[h] = (r[h] * inv) * weight[h];
    }
}

/* This file's entry of the signature table (deepinfer_kernels/cpu/sources.py): the loader
 * compares the two and refuses the library when they differ. */
const char *deepinfer_abi_add_rms_norm(void) { return "1|deepinfer_add_rms_norm(pppppiif)v"; }
