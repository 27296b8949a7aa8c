/*
 * pool_model.c — the chunk uploads of one plan (n_persist, n_buffer), window
 * by window, as the runtime's buffer pool makes them (runtime/chunk_runtime.c
 * over runtime/buffer_pool.c), in O(1) per block.
 *
 * The runtime (n = min(n_buffer, |Q|) slots; C_b = block b's streamed chunks,
 * a contiguous rank range; consecutive blocks may share chunks):
 *  - gather(b) walks C_b in ascending order. A chunk prefetched earlier is
 *    claimed; a chunk the previous block also used is acquired again; any
 *    other is acquired from the pool: a hit when a slot still holds it, else a
 *    SYNCHRONOUS upload (the block waits for it: exposed) into the victim slot
 *    (an untagged one, else the unleased slot released longest ago). Then it
 *    prefetches block b+1 (b-1 in backward): ascending over the chunks that
 *    block does not share with b, acquiring each (a hit, or an ASYNC upload
 *    that overlaps block b's compute) until no unleased slot is left; the rest
 *    are acquired by their own gather.
 *  - release(b) drops the leases in ascending order, stamping the slots.
 *  - nothing prefetches block 0 in forward nor block N-1 in backward; a block
 *    with no chunks at all gathers and prefetches nothing.
 *
 * Forward. No chunk is cached at step start (the optimizer step invalidates
 * the slots of trainable chunks; frozen chunks that would still hit are not
 * modelled: conservative). When block b prefetches, the unleased slots are
 * n - |C_b|, all holding chunks forward no longer needs, so the first
 * min(n - |C_b|, |N_{b+1}|) chunks of N_{b+1} = C_{b+1} \ C_b upload during
 * block b and the rest synchronously at gather(b+1). Victims are always the
 * lowest released ranks (release order = rank order), so at the end of
 * forward the slots hold the last n ranks of Q.
 *
 * Backward. The unleased slots form a queue in eviction order
 *   G   forward-cached chunks not used yet (oldest stamps, ascending ranks),
 *   D   chunks no longer needed,
 *   S   chunks of block b shared with block b+1: release(b+1) stamps them
 *       first, so they are the oldest of that release,
 *   D2  the rest of that release.
 * A run of acquires over ascending ranks R: a chunk still in the queue is a
 * hit and leaves it; any other misses and pops the queue front. Once the pops
 * reach R's own chunks (G inside R, or S) before they are processed, every
 * one of them misses (each miss pops the next one). So LRU evicts still-useful
 * forward-cached chunks before dead ones, and a block whose prefetch misses
 * part of its chunks loses the cached rest too; with fewer slots than the
 * lookahead minimum a gather's synchronous misses also evict the shared
 * chunks it is about to re-acquire. The model charges exactly that
 * (tests/unit/test_pool_model.c replays chunk_runtime.c's loops on a real
 * pt_bufpool and compares every window).
 */
#include "cost_internal.h"
#include "protrain.h"

#include <string.h>

static inline int32_t i32max(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t i32min(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int64_t i64min(int64_t a, int64_t b) { return a < b ? a : b; }
#define rbytes pt_pool_bytes

void pt_pool_walk_init(const pt_cost_ctx *cx, int32_t p, int32_t nb, pt_pool_walk *w) {
    memset(w, 0, sizeof *w);
    w->cx = cx;
    if (p < 0) p = 0;
    if (p > cx->K) p = cx->K;
    w->base = cx->cnt[p];
    int32_t q = cx->n_nm - w->base;
    w->nbe = nb < 0 ? 0 : i32min(nb, q);
    /* end of forward: the slots hold the last nbe ranks */
    w->g1 = cx->n_nm;
    w->g0 = cx->n_nm - w->nbe;
    w->p = p;
    w->simple = cx->all_have && w->nbe >= cx->nbmin[p];
}

/* ---- backward ---- */

enum { Q_GB,
       Q_GR,
       Q_D,
       Q_S,
       Q_D2,
       Q_N };   /* G below R, G inside R, D, S, D2 */

typedef struct run {
    int64_t q[Q_N], taken[Q_N];
    int64_t n, done;          /* acquires possible, acquires made */
    uint64_t miss;            /* bytes uploaded */
    int64_t nmiss;            /* chunks uploaded */
} run;

static void pop(run *r, int64_t k) {
    for (int i = 0; i < Q_N && k > 0; i++) {
        int64_t t = i64min(k, r->q[i]);
        r->q[i] -= t;
        r->taken[i] += t;
        k -= t;
    }
}

/* Ranks [x, y) not in the queue: misses. */
static void misses(const pt_pool_walk *w, run *r, int64_t x, int64_t y) {
    int64_t k = i64min(y - x, r->n - r->done);
    if (k <= 0) return;
    r->miss += rbytes(w, x, x + k);
    r->nmiss += k;
    pop(r, k);
    r->done += k;
}

/* Ranks [x, y) that were queue segment i: hits unless the pops reached it first. */
static void segment(const pt_pool_walk *w, run *r, int64_t x, int64_t y, int i) {
    if (y <= x) return;
    if (r->taken[i]) {
        misses(w, r, x, y);
        return;
    }
    int64_t k = i64min(y - x, r->n - r->done);
    r->q[i] -= k;
    r->done += k;
}

/* pt_pool_acquire with forward-cached chunks still in the queue (G): the
 * phases of R against the segments, counted in O(1). */
pt_pool_run pt_pool_acquire_slow(pt_pool_walk *w, int32_t r0, int32_t r1, int may_fail) {
    run r;
    memset(&r, 0, sizeof r);
    int32_t gtop = i32min(w->g1, r0);
    r.q[Q_GB] = gtop > w->g0 ? gtop - w->g0 : 0;
    int32_t c0 = i32max(w->g0, r0), c1 = i32min(w->g1, r1);
    if (c1 <= c0) c0 = c1 = r0;
    r.q[Q_GR] = c1 - c0;
    r.q[Q_D] = w->d;
    /* S lies inside R (the chunks of this block shared with the one above) */
    int32_t s0 = w->s0, s1 = w->s1;
    if (s1 <= s0) s0 = s1 = r1;
    r.q[Q_S] = s1 - s0;
    r.q[Q_D2] = w->d2;
    int64_t z = 0;
    for (int i = 0; i < Q_N; i++) z += r.q[i];
    r.n = r1 - r0;
    if (may_fail && r.n > z) r.n = z;
    /* R in ascending order: [r0,c0) [c0,c1)=G [c1,s0) [s0,s1)=S [s1,r1) */
    misses(w, &r, r0, c0);
    segment(w, &r, c0, c1, Q_GR);
    misses(w, &r, c1, s0);
    segment(w, &r, s0, s1, Q_S);
    misses(w, &r, s1, r1);
    /* G below R lost its lowest ranks to the pops; G inside R and S are used up
     * (a prefetch that ran out of slots left nothing in the queue at all) */
    if (r.q[Q_GB] > 0) {
        w->g0 = w->g0 + (int32_t)r.taken[Q_GB];
        w->g1 = w->g0 + (int32_t)r.q[Q_GB];
    } else {
        w->g0 = w->g1 = 0;
    }
    w->d = r.q[Q_D] + r.q[Q_S] + r.q[Q_D2];
    w->s0 = w->s1 = 0;
    w->d2 = 0;
    return (pt_pool_run){r.done, r.miss, r.nmiss};
}

int pt_pool_uploads(const pt_cost_ctx *cx, int32_t p, int32_t nb, uint64_t *fwd_sync, uint64_t *fwd_prefetch,
                    uint64_t *bwd_sync, uint64_t *bwd_prefetch) {
    if (p < 0 || p > cx->K || nb < pt_cost_buffer_min_block(cx, p)) return PT_ERR_INVALID_ARG;
    pt_pool_walk w;
    pt_pool_walk_init(cx, p, nb, &w);
    for (int32_t b = 0; b < cx->N; b++) pt_pool_fwd(&w, b, &fwd_sync[b], &fwd_prefetch[b]);
    for (int32_t b = cx->N - 1; b >= 0; b--) {
        pt_pool_xfer x = pt_pool_bwd(&w, b);
        bwd_sync[b] = x.sync;
        bwd_prefetch[b] = x.prefetch;
    }
    return PT_OK;
}
