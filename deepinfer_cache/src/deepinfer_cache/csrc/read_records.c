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
 * With overlap > 0 and more than one preadv to make, that many threads (up to 4) make the
 * reads, claiming them in file order, while the calling thread hashes each piece as soon as
 * the read that filled it is done: one thread alternating the two takes the read time plus
 * the hashing time, since the kernel's readahead keeps only about one request ahead of a
 * reader (and none at all for O_DIRECT, where two threads keep two requests in flight).
 *
 * With direct set (for an O_DIRECT descriptor, whose reads must be aligned, which the caller
 * ensures), each slot is read whole by one iovec into a frame of slot_bytes that starts
 * head_bytes before dests[i] (the header lands in front of the payload, the padding after it),
 * batches of about hot_bytes, and headers are copied to heads afterwards; a short read ends the
 * run (the records it did not complete are not done).
 *
 * Results: done[i] = 1 when record i was read whole and digests[i] holds its payload's XXH3-64,
 * else 0 (the file ended, or a read failed, before it was complete). Returns 0, -1 for an
 * unusable argument or a failed allocation, or -errno of the failed read (records completed
 * before it keep done[i] = 1). Nothing here judges a record: the caller checks every header
 * and compares every digest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
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

#define DIC_MAX_IOV 1000 /* iovecs per preadv, below IOV_MAX (1024) */
#define DIC_MAX_READERS 4 /* reading threads of one call */

/* preadv until `total` bytes are in or the file ends; the bytes read, or -errno. iov is
 * advanced in place on short reads. With `direct` (an O_DIRECT descriptor) a short read is
 * taken as the end of the file: a retry would start at an unaligned offset. */
static int64_t read_all(int fd, struct iovec *iov, int cnt, int64_t offset, size_t total,
                        int direct) {
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
        if (direct && got < total)
            break;
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

/* One preadv batch: a range of the planned iovecs and of the pieces they fill. */
typedef struct {
    int64_t pos;   /* file offset */
    size_t bytes;  /* bytes the batch asks for */
    int64_t iov0;  /* first iovec */
    int cnt;       /* iovecs */
    int64_t piece0; /* first piece */
    int64_t pieces;
    int64_t got;   /* bytes read, or -errno */
    int ready;     /* its read has finished (got is set); under dic_shared.mu */
} dic_batch;

/* Planning: the next piece of record `record`'s payload (at most piece_bytes, from *payload_at
 * of page_bytes, in `payload`), which lands at batch-relative byte `at`; advances *payload_at
 * and returns the piece's length. */
static size_t plan_piece(dic_piece *pc, int64_t record, const uint8_t *payload,
                         int64_t *payload_at, int64_t page_bytes, int64_t piece_bytes, size_t at) {
    size_t len = (size_t)(page_bytes - *payload_at);
    if (len > (size_t)piece_bytes)
        len = (size_t)piece_bytes;
    pc->record = record;
    pc->data = payload + *payload_at;
    pc->len = len;
    pc->first = *payload_at == 0;
    *payload_at += (int64_t)len;
    pc->last = *payload_at == page_bytes;
    pc->end = at + len;
    return len;
}

/* Planning: closes `cur` (counts it in *nb) when it is the run's last (`last`) or holds about
 * hot_bytes or DIC_MAX_IOV iovecs, and then (unless last) starts the next batch right after
 * it in the file, at iovec nv and piece np; returns the batch to keep filling. */
static dic_batch *close_batch_if_full(dic_batch *batches, dic_batch *cur, int64_t *nb, int last,
                                      int64_t hot_bytes, int64_t nv, int64_t np) {
    if (!last && cur->bytes < (size_t)hot_bytes && cur->cnt < DIC_MAX_IOV)
        return cur;
    ++*nb;
    if (last)
        return cur;
    int64_t pos = cur->pos + (int64_t)cur->bytes;
    dic_batch *next = &batches[*nb];
    memset(next, 0, sizeof(*next));
    next->pos = pos;
    next->iov0 = nv;
    next->piece0 = np;
    return next;
}

/* The batches shared between the reading threads and the hashing (calling) thread. */
typedef struct {
    int fd;
    int direct;
    struct iovec *iov;
    dic_batch *batches;
    int64_t nb;
    int64_t next;    /* the next batch a reading thread claims, in file order */
    int64_t stop_at; /* the first batch that came up short or failed (nb: none yet) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} dic_shared;

static int64_t read_batch(int fd, struct iovec *iov, dic_batch *b, int direct) {
    return read_all(fd, iov + b->iov0, b->cnt, b->pos, b->bytes, direct);
}

/* A reading thread: claims the next batch in file order and reads it, until none is left or
 * a batch came up short (with two threads, two reads are in flight at once). */
static void *reader_main(void *arg) {
    dic_shared *sh = (dic_shared *)arg;
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        int64_t b = sh->next++;
        int over = b >= sh->nb || b > sh->stop_at;
        pthread_mutex_unlock(&sh->mu);
        if (over)
            break;
        dic_batch *bt = &sh->batches[b];
        int64_t got = read_batch(sh->fd, sh->iov, bt, sh->direct);
        pthread_mutex_lock(&sh->mu);
        bt->got = got;
        bt->ready = 1;
        if ((got < 0 || (size_t)got < bt->bytes) && b < sh->stop_at)
            sh->stop_at = b;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
    }
    return NULL;
}

/* Hash the pieces of batch bt that its read filled; 0 to go on, 1 to stop (short read or
 * error: later records stay not done), with *rc set for an error. */
static int hash_batch(const dic_xxh3_fns *fns, void *state, const dic_piece *pieces,
                      const dic_batch *bt, uint64_t *digests, uint8_t *done, int *rc) {
    for (int64_t k = 0; k < bt->pieces; ++k) {
        const dic_piece *p = &pieces[bt->piece0 + k];
        if (bt->got < 0 || p->end > (size_t)bt->got)
            break; /* this piece (and so its record) is incomplete */
        if (p->first)
            fns->reset(state);
        fns->update(state, p->data, p->len);
        if (p->last) {
            digests[p->record] = fns->digest(state);
            done[p->record] = 1;
        }
    }
    if (bt->got < 0) {
        *rc = (int)bt->got;
        return 1;
    }
    return (size_t)bt->got < bt->bytes;
}

int dic_read_records(const dic_xxh3_fns *fns, int fd, int64_t offset, int64_t n,
                     int64_t slot_bytes, int64_t head_bytes, int64_t page_bytes,
                     int64_t piece_bytes, int64_t hot_bytes, uint8_t *heads,
                     uint8_t *const *dests, uint64_t *digests, uint8_t *done, int overlap,
                     int direct) {
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
    int64_t per_record = (page_bytes + piece_bytes - 1) / piece_bytes; /* pieces */
    int64_t max_iov = n * (per_record + 2), max_pieces = n * per_record;
    uint8_t *scratch = pad ? (uint8_t *)malloc(pad) : NULL;
    struct iovec *iov = (struct iovec *)malloc(sizeof(struct iovec) * (size_t)max_iov);
    dic_piece *pieces = (dic_piece *)malloc(sizeof(dic_piece) * (size_t)max_pieces);
    dic_batch *batches = (dic_batch *)malloc(sizeof(dic_batch) * (size_t)max_iov);
    void *state = fns->create();
    int rc = 0;
    if ((pad && scratch == NULL) || iov == NULL || pieces == NULL || batches == NULL ||
        state == NULL) {
        rc = -1;
        goto out;
    }
    /* Plan: every record contributes its header, its payload in pieces, then (unless it is
     * the run's last) the padding up to the next slot; a batch (one preadv) closes once it
     * holds about hot_bytes or DIC_MAX_IOV iovecs. */
    int64_t nv = 0, np = 0, nb = 0;
    dic_batch *cur = &batches[0];
    memset(cur, 0, sizeof(*cur));
    cur->pos = offset;
    for (int64_t i = 0; i < n; ++i) {
        int64_t payload_at = 0;
        int stage = 0; /* 0 header, 1 payload, 2 padding, 3 done */
        if (direct) {
            /* The whole slot in one iovec, into the frame around dests[i]: its header in
             * the head_bytes before the payload, its padding after it. */
            size_t start = cur->bytes;
            iov[nv].iov_base = dests[i] - head_bytes;
            iov[nv].iov_len = (size_t)slot_bytes;
            while (payload_at < page_bytes) {
                size_t at = start + (size_t)head_bytes + (size_t)payload_at;
                plan_piece(&pieces[np++], i, dests[i], &payload_at, page_bytes, piece_bytes, at);
                cur->pieces++;
            }
            cur->bytes += (size_t)slot_bytes;
            cur->cnt++;
            ++nv;
            cur = close_batch_if_full(batches, cur, &nb, i + 1 == n, hot_bytes, nv, np);
            continue;
        }
        while (stage < 3) {
            if (stage == 0) {
                iov[nv].iov_base = heads + i * head_bytes;
                iov[nv].iov_len = (size_t)head_bytes;
                stage = 1;
            } else if (stage == 1) {
                iov[nv].iov_base = dests[i] + payload_at;
                iov[nv].iov_len = plan_piece(&pieces[np++], i, dests[i], &payload_at, page_bytes,
                                             piece_bytes, cur->bytes);
                cur->pieces++;
                if (payload_at == page_bytes)
                    stage = (pad && i + 1 < n) ? 2 : 3;
            } else {
                iov[nv].iov_base = scratch;
                iov[nv].iov_len = pad;
                stage = 3;
            }
            cur->bytes += iov[nv].iov_len;
            cur->cnt++;
            ++nv;
            cur = close_batch_if_full(batches, cur, &nb, i + 1 == n && stage == 3, hot_bytes, nv,
                                      np);
        }
    }
    /* Run: with overlap (the number of reading threads, at most DIC_MAX_READERS) and more
     * than one batch, reading threads claim the batches in file order while this one hashes
     * each as soon as its read is done, so the reads keep the disk busy while the payloads
     * are hashed (a single thread alternates the two: the run then takes the read time plus
     * the hashing time). */
    dic_shared sh;
    int threads = 0;
    pthread_t tids[DIC_MAX_READERS];
    if (overlap > 0 && nb > 1) {
        sh.fd = fd;
        sh.direct = direct;
        sh.iov = iov;
        sh.batches = batches;
        sh.nb = nb;
        sh.next = 0;
        sh.stop_at = nb;
        int want = overlap < DIC_MAX_READERS ? overlap : DIC_MAX_READERS;
        if (pthread_mutex_init(&sh.mu, NULL) == 0) {
            if (pthread_cond_init(&sh.cv, NULL) == 0) {
                while (threads < want &&
                       pthread_create(&tids[threads], NULL, reader_main, &sh) == 0)
                    ++threads;
                if (!threads)
                    pthread_cond_destroy(&sh.cv);
            }
            if (!threads)
                pthread_mutex_destroy(&sh.mu);
        }
    }
    for (int64_t b = 0; b < nb; ++b) {
        if (threads) {
            pthread_mutex_lock(&sh.mu);
            while (!batches[b].ready && sh.stop_at >= b)
                pthread_cond_wait(&sh.cv, &sh.mu);
            int ready = batches[b].ready;
            pthread_mutex_unlock(&sh.mu);
            if (!ready)
                break; /* an earlier batch came up short: this one is not read */
        } else {
            batches[b].got = read_batch(fd, iov, &batches[b], direct);
        }
        if (hash_batch(fns, state, pieces, &batches[b], digests, done, &rc))
            break;
    }
    if (threads) {
        /* The readers stop by themselves after the last batch or past a short one; this
         * thread only leaves the loop early after such a batch, so the joins wait on at most
         * the reads already in flight. */
        for (int t = 0; t < threads; ++t)
            pthread_join(tids[t], NULL);
        pthread_cond_destroy(&sh.cv);
        pthread_mutex_destroy(&sh.mu);
    }
    if (direct) /* every header read whole is in its frame: hand it over as a run's heads */
        for (int64_t i = 0; i < n; ++i)
            if (done[i])
                memcpy(heads + i * head_bytes, dests[i] - head_bytes, (size_t)head_bytes);
out:
    if (state != NULL)
        fns->free_state(state);
    free(batches);
    free(pieces);
    free(iov);
    free(scratch);
    return rc;
}
