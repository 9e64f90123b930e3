/* The xxh3_128 block-hash chain in one call (see hashing.py for the scheme).
 *
 * h_i = XXH3-128(h_{i-1} || block_i), written in xxHash's canonical (big-endian) form, which is
 * what xxhash.xxh3_128_digest returns, so the keys are byte-identical to the Python loop's.
 *
 * The hash function is passed in as a pointer (XXH3_128bits from the xxhash module Python has
 * already loaded): this file needs no xxHash headers and runs the very code the Python path
 * runs, so the two cannot drift apart. The returned struct {low64, high64} is xxHash's stable
 * XXH128_hash_t ABI (0.8.x).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t low64;
    uint64_t high64;
} dic_xxh128_t;

typedef dic_xxh128_t (*dic_xxh3_128_fn)(const void *data, size_t len);

static void put_be64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; --i) {
        p[i] = (uint8_t)(v & 0xff);
        v >>= 8;
    }
}

/* Hash n_blocks blocks of block_bytes bytes each from tokens, chained from the 16-byte root,
 * into out (16 * n_blocks bytes). Returns 0, or -1 when an argument is unusable. */
int dic_chain_xxh3_128(dic_xxh3_128_fn fn, const uint8_t *root, const uint8_t *tokens,
                       int64_t n_blocks, int64_t block_bytes, uint8_t *out) {
    if (fn == NULL || root == NULL || out == NULL || n_blocks < 0 || block_bytes <= 0)
        return -1;
    if (n_blocks == 0)
        return 0;
    if (tokens == NULL)
        return -1;
    /* The message is parent || block: one buffer reused for every block. */
    uint8_t *msg = (uint8_t *)malloc((size_t)block_bytes + 16);
    if (msg == NULL)
        return -1;
    const uint8_t *parent = root;
    for (int64_t i = 0; i < n_blocks; ++i) {
        memcpy(msg, parent, 16);
        memcpy(msg + 16, tokens + i * block_bytes, (size_t)block_bytes);
        dic_xxh128_t h = fn(msg, (size_t)block_bytes + 16);
        uint8_t *dst = out + 16 * i;
        put_be64(dst, h.high64);
        put_be64(dst + 8, h.low64);
        parent = dst;
    }
    free(msg);
    return 0;
}
