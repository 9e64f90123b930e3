/* Read a run of consecutive segment records and hash their payloads, in one call.
 *
 * A run is n records in consecutive slots of one segment file, starting at byte offset
 * `offset`; each slot is slot_bytes: a head_bytes record header, a page_bytes payload, then
 * padding. Headers go to heads + i * head_bytes, payloads straight into dests[i] (a page the
 * caller lends), padding into a scratch buffer. The reads are preadv calls of about hot_bytes,
 * with payloads split into pieces of at most piece_bytes, and every piece is hashed (XXH3-64,
 * streaming) right after the read that filled it, while it is still in the core's cache.
 *
 * Why in C: from Python each 2 MiB record cost a slice, a memoryview, a preadv call and a
 * hasher update per 256 KiB piece plus the list building around them, with the GIL held
 * throughout; here a whole run is one call that runs without the GIL (ctypes releases it).
 *
 * The hash functions are passed in as pointers (XXH3_createState/_64bits_reset/_update/
 * _digest/XXH3_freeState from the xxhash module Python has already loaded), so this file needs
 * no xxHash headers and hashes with the very code the Python path uses.
 *
 * Results: done[i] = 1 when record i was read whole and digests[i] holds its payload's XXH3-64,
 * else 0 (the file ended, or a read failed, before it was complete). Returns 0, -1 for an
 * unusable argument or a failed allocation, or -errno of the failed read (records completed
 * before it keep done[i] = 1). Nothing here judges a record: the caller checks every header
 * and compares every digest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef void *(*dic_create_fn)(void);
typedef int (*dic_free_fn)(void *);
typedef int (*dic_reset_fn)(void *);
typedef int (*dic_update_fn)(void *, const void *, size_t);
typedef uint64_t (*dic_digest_fn)(const void *);

typedef struct {
    dic_create_fn create;
    dic_free_fn free_state;
    dic_reset_fn reset;
    dic_update_fn update;
    dic_digest_fn digest;
} dic_xxh3_fns;

/* One payload piece to hash once the read that fills it is done. */
typedef struct {
    int64_t record;
    const uint8_t *data;
    size_t len;
    int first; /* first piece of its record: reset the state first */
    int last;  /* last piece: the digest is ready after it */
    size_t end; /* batch-relative byte offset where this piece ends */
} dic_piece;

#define DIC_MAX_IOV 1000 /* below IOV_MAX (1024) */

/* preadv until `total` bytes are in or the file ends; the bytes read, or -errno. iov is
 * advanced in place on short reads. */
static int64_t read_all(int fd, struct iovec *iov, int cnt, int64_t offset, size_t total) {
    size_t got = 0;
    int at = 0;
    while (got < total && at < cnt) {
        ssize_t r = preadv(fd, iov + at, cnt - at, (off_t)(offset + (int64_t)got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -(int64_t)errno;
        }
        if (r == 0)
            break; /* end of file */
        got += (size_t)r;
        size_t n = (size_t)r;
        while (at < cnt && n >= iov[at].iov_len) {
            n -= iov[at].iov_len;
            ++at;
        }
        if (at < cnt && n) {
            iov[at].iov_base = (uint8_t *)iov[at].iov_base + n;
            iov[at].iov_len -= n;
        }
    }
    return (int64_t)got;
}

int dic_read_records(const dic_xxh3_fns *fns, int fd, int64_t offset, int64_t n,
                     int64_t slot_bytes, int64_t head_bytes, int64_t page_bytes,
                     int64_t piece_bytes, int64_t hot_bytes, uint8_t *heads,
                     uint8_t *const *dests, uint64_t *digests, uint8_t *done) {
    if (fns == NULL || fns->create == NULL || fns->free_state == NULL || fns->reset == NULL ||
        fns->update == NULL || fns->digest == NULL || n < 0 || head_bytes <= 0 ||
        page_bytes <= 0 || piece_bytes <= 0 || hot_bytes <= 0 ||
        slot_bytes < head_bytes + page_bytes || (n > 0 && (heads == NULL || dests == NULL ||
                                                           digests == NULL || done == NULL)))
        return -1;
    for (int64_t i = 0; i < n; ++i) {
        done[i] = 0;
        if (dests[i] == NULL)
            return -1;
    }
    if (n == 0)
        return 0;
    size_t pad = (size_t)(slot_bytes - head_bytes - page_bytes);
    uint8_t *scratch = pad ? (uint8_t *)malloc(pad) : NULL;
    struct iovec *iov = (struct iovec *)malloc(sizeof(struct iovec) * DIC_MAX_IOV);
    dic_piece *pieces = (dic_piece *)malloc(sizeof(dic_piece) * DIC_MAX_IOV);
    void *state = fns->create();
    int rc = 0;
    if ((pad && scratch == NULL) || iov == NULL || pieces == NULL || state == NULL) {
        rc = -1;
        goto out;
    }
    int64_t pos = offset;   /* file offset of the batch being built */
    int cnt = 0, np = 0;    /* iovecs and pieces in the batch */
    size_t bytes = 0;       /* bytes in the batch */
    for (int64_t i = 0; i < n && rc == 0; ++i) {
        /* Each record contributes: its header, its payload in pieces, then (unless it is the
         * run's last) the padding up to the next slot. The batch is read once it holds about
         * hot_bytes or the iovec array is nearly full (a record adds at most 3 + its pieces,
         * so the check before each entry keeps room). */
        int64_t payload_at = 0;
        int stage = 0; /* 0 header, 1 payload, 2 padding, 3 done */
        while (stage < 3) {
            if (stage == 0) {
                iov[cnt].iov_base = heads + i * head_bytes;
                iov[cnt].iov_len = (size_t)head_bytes;
                bytes += (size_t)head_bytes;
                ++cnt;
                stage = 1;
            } else if (stage == 1) {
                size_t len = (size_t)(page_bytes - payload_at);
                if (len > (size_t)piece_bytes)
                    len = (size_t)piece_bytes;
                iov[cnt].iov_base = dests[i] + payload_at;
                iov[cnt].iov_len = len;
                bytes += len;
                ++cnt;
                pieces[np].record = i;
                pieces[np].data = dests[i] + payload_at;
                pieces[np].len = len;
                pieces[np].first = payload_at == 0;
                payload_at += (int64_t)len;
                pieces[np].last = payload_at == page_bytes;
                pieces[np].end = bytes;
                ++np;
                if (payload_at == page_bytes)
                    stage = (pad && i + 1 < n) ? 2 : 3;
            } else {
                iov[cnt].iov_base = scratch;
                iov[cnt].iov_len = pad;
                bytes += pad;
                ++cnt;
                stage = 3;
            }
            int full = bytes >= (size_t)hot_bytes || cnt >= DIC_MAX_IOV - 1;
            int end = i + 1 == n && stage == 3;
            if (!full && !end)
                continue;
            int64_t got = read_all(fd, iov, cnt, pos, bytes);
            for (int k = 0; k < np; ++k) {
                dic_piece *p = &pieces[k];
                if (got < 0 || p->end > (size_t)got)
                    break; /* this piece (and so its record) is incomplete */
                if (p->first)
                    fns->reset(state);
                fns->update(state, p->data, p->len);
                if (p->last) {
                    digests[p->record] = fns->digest(state);
                    done[p->record] = 1;
                }
            }
            if (got < 0) {
                rc = (int)got;
                break;
            }
            if ((size_t)got < bytes)
                goto out; /* end of file: later records stay not done */
            pos += (int64_t)bytes;
            cnt = np = 0;
            bytes = 0;
        }
    }
out:
    if (state != NULL)
        fns->free_state(state);
    free(pieces);
    free(iov);
    free(scratch);
    return rc;
}
