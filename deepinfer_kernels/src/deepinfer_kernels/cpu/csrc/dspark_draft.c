/* The DSpark drafter's greedy block, and its context entries, each as one call.
 *
 * deepinfer_dspark_greedy_draft, for each row b < B (reference: cpu/dspark_draft.py,
 * dspark_greedy_draft_reference; the torch modules: deepinfer_spec's DSparkDrafter):
 *
 *   x      = [anchor_embed[b] ; mask_embed[0 .. G-2]]                         [G, H]
 *   per backbone layer l (weights: a table of addresses, see LAYER_* below):
 *     h    = rmsnorm(x) * in_w
 *     q, k, v = h Wqkv^T                       (the block's queries, keys, values)
 *     keys = [rope(ctx_k, -W .. -1) ; rope(k, 0 .. G-1)], values = [ctx_v ; v]
 *            (ctx_k, ctx_v: row b's context entries, unrotated; invalid ones are skipped)
 *     a    = softmax(rope(q, 0 .. G-1) keys^T / sqrt(D)) values   per head, grouped queries
 *     x    = x + a Wo^T;  n = rmsnorm(x) * post_w;  x = x + (silu(n Wg^T) * (n Wu^T)) Wd^T
 *   u_k    = rmsnorm_target(x_k) * head_norm_w  Whead^T                      k < m
 *   (the last layer computes its queries, output projection and MLP for rows k < m only:
 *   nothing reads the others; hidden_out, when given, receives x_k for k < m)
 *   for k = 0 .. m-1 (x_0 = the anchor's token):
 *     e_k  = W1[prev];  logits = u_k + e_k W2^T;  i = argmax (lowest index on ties, a NaN wins
 *            as in torch.argmax);  prev = tokens[b, k] = vocab_ids ? vocab_ids[i] : i
 *     conf[b, k] = sigmoid(w_conf . [x_k ; e_k] + b_conf)
 *
 * deepinfer_dspark_context_kv, for T positions' raw target features f [T, F]:
 *
 *   p = rmsnorm(((f - shift) * scale) Wc^T) * norm_w;   out = p Wkv^T        [T, L * 2 * kv]
 *
 * Every drafter weight (Wqkv, Wo, Wgu = [Wg; Wu], Wd, W2, Wc, Wkv) is a bf16 panel tensor
 * (bf16_weight_linear.c: the checkpoint's bf16 values, exact); the head rows are the target's
 * own GGUF rows of the draft vocabulary (quant_gemv.c: any format it reads, F32 included).
 * Arithmetic is fp32, so results equal the torch modules' up to fp32 rounding (another
 * summation order); a near-tie between two logits can then pick the other token, as between
 * any two exact fp32 products.
 *
 * Why: the torch drafter's greedy proposal is ~80 torch ops and a dozen foreign product calls,
 * whose dispatch cost about as much as the arithmetic of its few-row products. Here a proposal
 * is one call; its products still split their weights between the caller's OpenMP threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../../quant/csrc/quant_gemv.c"
#include "add_rms_norm.c"
#include "bf16_weight_linear.c"

/* Per backbone layer, 6 addresses in this order. */
enum { LAYER_IN_NORM, LAYER_QKV, LAYER_O, LAYER_POST_NORM, LAYER_GATE_UP, LAYER_DOWN, LAYER_FIELDS };

static void rope_rows(float *x, int64_t stride, int64_t rows, int64_t heads, int64_t d,
                      const float *cos, const float *sin) {
    /* (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) over the halves of each head; table row r for row r */
    int64_t half = d / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * half, *s = sin + r * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + r * stride + h * d;
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

static inline float sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }

/* scratch floats for one row of deepinfer_dspark_greedy_draft */
static int64_t draft_scratch(int64_t G, int64_t W, int64_t H, int64_t hq, int64_t hkv, int64_t d,
                             int64_t I, int64_t V, int64_t r) {
    int64_t qkv = (hq + 2 * hkv) * d;
    return G * (4 * H + qkv + hq * d + 3 * I + V) + 2 * (W + G) * hkv * d + (W + G) + V;
}

/* Returns 0; -1 when a scratch buffer cannot be allocated. */
int deepinfer_dspark_greedy_draft(
    const float *anchor_embed, const float *mask_embed, const float *context, int64_t ctx_stride,
    const uint8_t *valid, const float *k_cos, const float *k_sin, const int64_t *layers,
    const float *head_norm_w, float head_eps, const uint8_t *head_w, int64_t head_qtype,
    int64_t head_row_bytes, const float *markov_in, const uint16_t *markov_out_panels,
    const int64_t *vocab_ids, const float *conf_w, float conf_b, const int64_t *anchor_ids,
    int64_t *tokens, float *conf, float *hidden_out, float eps, int64_t B, int64_t G, int64_t W,
    int64_t m, int64_t L, int64_t H, int64_t hq, int64_t hkv, int64_t d, int64_t I, int64_t V,
    int64_t r) {
    int64_t qkv_w = (hq + 2 * hkv) * d, kv = hkv * d, keys = W + G, rep = hq / hkv;
    int64_t ctx_w = L * 2 * kv;
    float *scratch = (float *)malloc((size_t)draft_scratch(G, W, H, hq, hkv, d, I, V, r) * 4);
    if (scratch == NULL) return -1;
    float *x = scratch, *h = x + G * H, *delta = h + G * H, *normed = delta + G * H;
    float *qkv = normed + G * H, *att = qkv + G * qkv_w, *gu = att + G * hq * d;
    float *act = gu + 2 * G * I, *kbuf = act + G * I, *vbuf = kbuf + keys * kv;
    float *prob = vbuf + keys * kv, *logits = prob + keys, *base = logits + V;
    const float scale = 1.0f / sqrtf((float)d);
    for (int64_t b = 0; b < B; b++) {
        const float *ctx = context + b * ctx_stride;
        const uint8_t *ok = valid ? valid + b * W : NULL;
        for (int64_t i = 0; i < H; i++) x[i] = anchor_embed[b * H + i];
        for (int64_t i = 0; i < (G - 1) * H; i++) x[H + i] = mask_embed[i];
        for (int64_t l = 0; l < L; l++) {
            const int64_t *lw = layers + l * LAYER_FIELDS;
            /* Every row's keys and values feed the attention, but after the last layer's
             * attention only the m drawn rows are read: their queries, output projection and
             * MLP are all that layer computes (the MLP is three quarters of the weights). */
            int64_t R = l == L - 1 ? m : G;
            deepinfer_add_rms_norm(x, 0, (const float *)lw[LAYER_IN_NORM], 0, h, G, H, eps);
            deepinfer_bf16_weight_linear(h, (const uint16_t *)lw[LAYER_QKV], 0, qkv, G, qkv_w, H);
            /* keys and values: the context's (unrotated, stored) then the block's */
            for (int64_t j = 0; j < W; j++) {
                const float *e = ctx + j * ctx_w + l * 2 * kv;
                for (int64_t i = 0; i < kv; i++) {
                    kbuf[j * kv + i] = e[i];
                    vbuf[j * kv + i] = e[kv + i];
                }
            }
            for (int64_t g = 0; g < G; g++)
                for (int64_t i = 0; i < kv; i++) {
                    kbuf[(W + g) * kv + i] = qkv[g * qkv_w + hq * d + i];
                    vbuf[(W + g) * kv + i] = qkv[g * qkv_w + hq * d + kv + i];
                }
            rope_rows(kbuf, kv, keys, hkv, d, k_cos, k_sin);
            rope_rows(qkv, qkv_w, R, hq, d, k_cos + W * (d / 2), k_sin + W * (d / 2));
            for (int64_t g = 0; g < R; g++)
                for (int64_t head = 0; head < hq; head++) {
                    const float *q = qkv + g * qkv_w + head * d;
                    int64_t kvh = head / rep;
                    float top = -INFINITY;
                    for (int64_t j = 0; j < keys; j++) {
                        if (j < W && ok && !ok[j]) {
                            prob[j] = -INFINITY;
                            continue;
                        }
                        /* dot() (gguf_blocks.h): 16 partial sums, so it vectorises */
                        float s = dot(q, kbuf + j * kv + kvh * d, d) * scale;
                        prob[j] = s;
                        if (s > top) top = s;
                    }
                    float sum = 0.0f;
                    for (int64_t j = 0; j < keys; j++) {
                        float p = prob[j] == -INFINITY ? 0.0f : expf(prob[j] - top);
                        prob[j] = p;
                        sum += p;
                    }
                    float *o = att + g * hq * d + head * d, inv = 1.0f / sum;
                    for (int64_t i = 0; i < d; i++) o[i] = 0.0f;
                    for (int64_t j = 0; j < keys; j++) {
                        if (prob[j] == 0.0f) continue;
                        const float *v = vbuf + j * kv + kvh * d;
                        float p = prob[j] * inv;
                        for (int64_t i = 0; i < d; i++) o[i] += p * v[i];
                    }
                }
            deepinfer_bf16_weight_linear(att, (const uint16_t *)lw[LAYER_O], 0, delta, R, H, hq * d);
            deepinfer_add_rms_norm(x, delta, (const float *)lw[LAYER_POST_NORM], x, normed, R, H,
                                   eps);
            deepinfer_bf16_weight_linear(normed, (const uint16_t *)lw[LAYER_GATE_UP], 0, gu, R,
                                         2 * I, H);
            for (int64_t g = 0; g < R; g++)
                for (int64_t i = 0; i < I; i++) {
                    float gate = gu[g * 2 * I + i], up = gu[g * 2 * I + I + i];
                    act[g * I + i] = gate / (1.0f + expf(-gate)) * up;
                }
            deepinfer_bf16_weight_linear(act, (const uint16_t *)lw[LAYER_DOWN], 0, delta, R, H, I);
            for (int64_t i = 0; i < R * H; i++) x[i] += delta[i];
        }
        if (hidden_out)
            for (int64_t i = 0; i < m * H; i++) hidden_out[b * m * H + i] = x[i];
        /* base logits of the m drawn positions: the target's final norm, then its head rows */
        deepinfer_add_rms_norm(x, 0, head_norm_w, 0, normed, m, H, head_eps);
        int rc = deepinfer_quant_linear(normed, m, H, head_w, V, H, head_row_bytes, head_qtype, 0,
                                        base);
        if (rc != 0) {
            free(scratch);
            return rc;
        }
        int64_t prev = anchor_ids[b];
        for (int64_t k = 0; k < m; k++) {
            const float *e = markov_in + prev * r;
            deepinfer_bf16_weight_linear(e, markov_out_panels, 0, logits, 1, V, r);
            int64_t best = 0;
            float top = -INFINITY;
            for (int64_t i = 0; i < V; i++) {
                float v = base[k * V + i] + logits[i];
                if (v != v) { /* NaN: torch.argmax returns the first one */
                    best = i;
                    break;
                }
                if (v > top || i == 0) {
                    top = v;
                    best = i;
                }
            }
            prev = vocab_ids ? vocab_ids[best] : best;
            tokens[b * m + k] = prev;
            float z = conf_b;
            for (int64_t i = 0; i < H; i++) z += conf_w[i] * x[k * H + i];
            for (int64_t i = 0; i < r; i++) z += conf_w[H + i] * e[i];
            conf[b * m + k] = sigmoidf(z);
        }
    }
    free(scratch);
    return 0;
}

/* Returns 0; -1 when a scratch buffer cannot be allocated. */
int deepinfer_dspark_context_kv(const float *features, const float *shift, const float *scale,
                                const uint16_t *proj_panels, const float *norm_w, float eps,
                                const uint16_t *kv_panels, float *out, int64_t T, int64_t F,
                                int64_t H, int64_t C) {
    float *buf = (float *)malloc((size_t)(T * (F + 2 * H)) * 4);
    if (buf == NULL) return -1;
    float *std = buf, *proj = std + T * F, *normed = proj + T * H;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < F; i++) std[t * F + i] = (features[t * F + i] - shift[i]) * scale[i];
    deepinfer_bf16_weight_linear(std, proj_panels, 0, proj, T, H, F);
    deepinfer_add_rms_norm(proj, 0, norm_w, 0, normed, T, H, eps);
    deepinfer_bf16_weight_linear(normed, kv_panels, 0, out, T, C, H);
    free(buf);
    return 0;
}

/* This file's entry of the signature table (deepinfer_kernels/cpu/sources.py): the loader
 * compares the two and refuses the library when they differ. */
const char *deepinfer_abi_dspark_draft(void) { return "1|deepinfer_dspark_greedy_draft(pppipppppfpiippppfppppfiiiiiiiiiiii)i|deepinfer_dspark_context_kv(pppppfppiiii)i"; }
