/*
 * cost_internal.h — the cost-model context shared by cost_model.c (context,
 * chunk sums, memory, evaluation), cost_act.c (activation profile),
 * cost_time.c (time and its lower bounds) and pool_model.c (what the buffer
 * pool uploads, window by window). Not for other modules: use cost_model.h.
 *
 * Chunk positions: the "rank" of a non-mandatory chunk is its index among the
 * non-mandatory chunks (mandatory ones are always persistent and never stream).
 * With n_persist = p the streamed set Q is the ranks [cnt[p], n_nm); a block's
 * streamed chunks are the ranks [max(rlo[b], base), max(rhi[b], base)).
 */
#ifndef PT_COST_INTERNAL_H
#define PT_COST_INTERNAL_H

#include <stdint.h>

#include "cost_model.h"

/* Range sums over the prefix arrays below ([lo, hi) of chunk index, 0 when
 * empty) and the min/max the cost files share. */
static inline uint64_t rsum(const uint64_t *pre, int32_t lo, int32_t hi) {
    return hi > lo ? pre[hi] - pre[lo] : 0;
}
static inline int32_t rcnt(const int32_t *pre, int32_t lo, int32_t hi) { return hi > lo ? pre[hi] - pre[lo] : 0; }
static inline int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }
static inline double dmax(double a, double b) { return a > b ? a : b; }

struct pt_cost_ctx {
    const pt_trace *t;
    int32_t N, K;
    int32_t n_nm;          /* non-mandatory chunks */
    int32_t interval;
    /* prefix sums over chunk index [0, k), non-mandatory chunks only; [K+1] */
    int32_t *cnt;
    uint64_t *bytes, *grad, *train, *dev, *host;
    int32_t *nm_pos;       /* [n_nm + 1]: chunk index of the j-th non-mandatory chunk (K at n_nm) */
    uint64_t *nmb;         /* [n_nm + 1]: param bytes of the first j non-mandatory chunks */
    uint64_t mand_dev, mand_train, mand_grad;
    int32_t *ntc;          /* [K+1] prefix counts of non-mandatory chunks with trainable elements */
    int32_t mand_ntc;      /* mandatory chunks with trainable elements */
    /* trainable elements of the mandatory chunks whose first block is b (oversize
     * ones: their gradient is final after b's backward), [N]; the rest of
     * mand_train (non-block parameters) is final only after backward */
    uint64_t *mand_blk, mand_nb;
    double *rks;                  /* [K+1] prefix sums of non-mandatory chunks' optim_s */
    double mand_rks;              /* optim_s of the mandatory (always resident) chunks */
    /* per block: chunk index ranges of first use / last use; [N] */
    int32_t *f_lo, *f_hi, *l_lo, *l_hi;
    /* per block: ranks of the non-mandatory chunks in its range, has = any chunk at all; [N] */
    int32_t *rlo, *rhi;
    uint8_t *has;
    int32_t *nbmin;        /* [K+1]: lookahead (two-block) minimum per n_persist */
    int32_t *nbmin1;       /* [K+1]: one-block minimum per n_persist */
    uint64_t max_block_bytes;  /* largest param bytes of one block's non-mandatory chunks */
    int all_have;          /* every block uses some chunk (the prefetch chain never breaks) */
    double coll_f;         /* all-reduce seconds per gradient byte (0 = none): over the
                              world, or with tensor parallel over world / tp_size replicas */
    double tpg_f;          /* tensor parallel: gather seconds per full byte (0 = none) */
    double tp_grad, tp_fac;   /* sums of the chunks' tp_grad_bytes, tp_factor_bytes */
    double ag_f, rs_f;     /* all-gather / reduce-scatter seconds per buffer byte (0 = none) */
    double comp_f, comp_b; /* pure compute of forward (embedding + blocks) and backward
                              (head/loss + blocks + embedding), without recompute */
    double *fstart;        /* [N]: forward compute before block b (embedding + blocks < b) */
    /* mode C REKLS (cost_rekls.c): prefix sums over non-mandatory chunks of their
     * REKLS aux words and m n, [K+1]; rk_max[k]: the largest one param's
     * aux + 2 m n among non-mandatory chunks >= k, [K+1] */
    uint64_t *rk_aux, *rk_mn, *rk_max;
};

/* Seconds of the device optimizer step over the resident trainable chunks
 * with n_persist = p (cost_time.c). */
double pt_cost_dev_opt_s(const pt_cost_ctx *cx, int32_t p);
/* cost_rekls.c — REKLS under mode C: the context's sums (PT_ERR_HOST_OOM or
 * PT_OK), the owner bound's bytes per rank for offloaded chunks [p, K), the
 * pinned bytes per rank given the replicated figure h_rep, and the seconds of
 * the per-step exchange with the owners. */
int pt_cost_rekls_ctx(pt_cost_ctx *cx);
void pt_cost_rekls_ctx_free(pt_cost_ctx *cx);
uint64_t pt_cost_rekls_owner_bytes(const pt_cost_ctx *cx, int32_t p);
uint64_t pt_cost_rekls_shard_host(const pt_cost_ctx *cx, int32_t p, uint64_t h_rep);
double pt_cost_rekls_shard_xchg_s(const pt_cost_ctx *cx, int32_t p);

/* Walk of the runtime's buffer pool for one (n_persist, n_buffer): see
 * pool_model.c for the rules it reproduces. Forward queries are independent;
 * backward ones must come in the order b = N-1, N-2, ..., 0. */
typedef struct pt_pool_walk {
    const pt_cost_ctx *cx;
    int32_t base;          /* first streamed rank */
    int32_t nbe;           /* slots the runtime allocates: min(n_buffer, |Q|) */
    /* simple: n_buffer at or above the lookahead minimum and every block has
     * chunks. Then every prefetch fits, no gather waits except block 0's in
     * forward, and in backward a block's last-use chunks [l_lo, l_hi) are all
     * hits when their lowest streamed rank is >= g0 (the first rank cached at
     * the turn) and all uploaded otherwise (a block missing one loses the
     * rest, see pool_model.c). Closed forms over chunk index, as fast as the
     * plain formula; the general walk gives the same bytes. */
    int simple;
    int32_t p;
    /* backward queue of unleased slots, eviction order: G, D, S, D2 */
    int32_t g0, g1;        /* forward-cached chunks not used yet in backward (ranks) */
    int64_t d;             /* slots holding chunks no longer needed */
    int32_t s0, s1;        /* chunks just released that the next block gathers again */
    int64_t d2;            /* the rest of the last release */
    int32_t pi;            /* chunks of the next block already prefetched (prefix) */
} pt_pool_walk;

/* Results by value: out-pointers of uint64_t may alias the walk's int64_t
 * fields, which would keep the walk in memory. */
typedef struct pt_pool_run {
    int64_t done;          /* acquires made */
    uint64_t miss;         /* bytes uploaded */
    int64_t nmiss;         /* uploads (chunks) made: each pays the copy latency */
} pt_pool_run;
typedef struct pt_pool_xfer {
    uint64_t sync, prefetch;   /* bytes */
    int64_t nsync, nprefetch;  /* copies */
} pt_pool_xfer;

void pt_pool_walk_init(const pt_cost_ctx *cx, int32_t n_persist, int32_t n_buffer, pt_pool_walk *w);
pt_pool_run pt_pool_acquire_slow(pt_pool_walk *w, int32_t r0, int32_t r1, int may_fail);

/* The walk runs for every candidate the searcher scores: the per-block steps
 * are inline, the rare general case of pt_pool_acquire is not. */

static inline int32_t pt_pool_lo(const pt_pool_walk *w, int32_t b) {
    return w->cx->rlo[b] > w->base ? w->cx->rlo[b] : w->base;
}
static inline int32_t pt_pool_hi(const pt_pool_walk *w, int32_t b) {
    return w->cx->rhi[b] > w->base ? w->cx->rhi[b] : w->base;
}
/* Param bytes of the ranks [x, y). */
static inline uint64_t pt_pool_bytes(const pt_pool_walk *w, int64_t x, int64_t y) {
    return y > x ? w->cx->nmb[y] - w->cx->nmb[x] : 0;
}

/* Forward: bytes uploaded synchronously at gather(b), and prefetched while
 * block b runs (for block b+1). Block b-1 prefetched the first
 * n - |C_{b-1}| of b's new chunks; b prefetches the first n - |C_b| of b+1's. */
/* Param bytes of the non-mandatory chunks of index [max(lo, p), hi). */
static inline uint64_t pt_pool_ibytes(const pt_pool_walk *w, int32_t lo, int32_t hi) {
    if (lo < w->p) lo = w->p;
    return hi > lo ? w->cx->bytes[hi] - w->cx->bytes[lo] : 0;
}
/* How many non-mandatory chunks of index [max(lo, p), hi): pt_pool_ibytes's copies. */
static inline int64_t pt_pool_icount(const pt_pool_walk *w, int32_t lo, int32_t hi) {
    if (lo < w->p) lo = w->p;
    return hi > lo ? w->cx->cnt[hi] - w->cx->cnt[lo] : 0;
}

static inline void pt_pool_fwd(const pt_pool_walk *w, int32_t b, uint64_t *sync, uint64_t *prefetch) {
    const pt_cost_ctx *cx = w->cx;
    *sync = *prefetch = 0;
    if (w->simple) {
        if (b == 0) *sync = pt_pool_ibytes(w, cx->f_lo[0], cx->f_hi[0]);
        if (b + 1 < cx->N) *prefetch = pt_pool_ibytes(w, cx->f_lo[b + 1], cx->f_hi[b + 1]);
        return;
    }
    if (w->nbe == 0 || !cx->has[b]) return;
    int32_t lo = pt_pool_lo(w, b), hi = pt_pool_hi(w, b), nlo = lo, pre = 0;
    if (b >= 1 && cx->has[b - 1]) {
        int32_t plo = pt_pool_lo(w, b - 1), phi = pt_pool_hi(w, b - 1), free = w->nbe - (phi - plo);
        nlo = lo > phi ? lo : phi;
        pre = free < 0 ? 0 : free < hi - nlo ? free
                                             : hi - nlo;
    }
    *sync = pt_pool_bytes(w, (int64_t)nlo + pre, hi);
    if (b + 1 < cx->N && cx->has[b + 1]) {
        int32_t n1 = pt_pool_lo(w, b + 1), free = w->nbe - (hi - lo), k;
        if (n1 < hi) n1 = hi;
        k = pt_pool_hi(w, b + 1) - n1;
        if (k > free) k = free;
        if (k > 0) *prefetch = pt_pool_bytes(w, n1, (int64_t)n1 + k);
    }
}

/* Acquire ranks [r0, r1) in order against the queue (G, D, S, D2); with
 * may_fail, stop when a miss finds no unleased slot (a prefetch). The queue
 * keeps G below r0, and D. */
static inline pt_pool_run pt_pool_acquire(pt_pool_walk *w, int32_t r0, int32_t r1, int may_fail) {
    if (w->g0 < w->g1) {
        /* through a copy: the caller's walk never has its address taken, so it
         * can live in registers */
        pt_pool_walk tmp = *w;
        pt_pool_run r = pt_pool_acquire_slow(&tmp, r0, r1, may_fail);
        *w = tmp;
        return r;
    }
    /* The usual case once the forward cache is used up: the queue is D, S,
     * D2 and R ends with S. The misses before S pop D; if they reach S, all
     * of S misses too. Either way the queue shrinks by one per acquire and
     * what remains is dead. */
    int64_t n = r1 - r0, s = w->s1 - w->s0, z = w->d + s + w->d2;
    if (may_fail && n > z) n = z;
    int64_t before = s ? w->s0 - r0 : n;   /* acquires before S */
    if (before > n) before = n;
    int64_t m = before <= w->d || !s ? before : n;   /* the misses */
    pt_pool_run r = {n, pt_pool_bytes(w, r0, r0 + m), m};
    w->d = z - n;
    w->s0 = w->s1 = 0;
    w->d2 = 0;
    return r;
}

/* Backward: bytes uploaded synchronously at gather(b) in backward, and
 * prefetched while block b runs (block b-1's chunks it does not share). */
static inline pt_pool_xfer pt_pool_bwd(pt_pool_walk *w, int32_t b) {
    const pt_cost_ctx *cx = w->cx;
    pt_pool_xfer x = {0, 0, 0, 0};
    if (w->simple) {
        if (b >= 1) {
            /* in ranks: a mandatory chunk may sit at index max(l_lo, p) */
            int32_t lo = cx->l_lo[b - 1] > w->p ? cx->l_lo[b - 1] : w->p;
            if (cx->cnt[lo] < w->g0) {
                x.prefetch = pt_pool_ibytes(w, lo, cx->l_hi[b - 1]);
                x.nprefetch = pt_pool_icount(w, lo, cx->l_hi[b - 1]);
            }
        }
        return x;
    }
    if (w->nbe == 0) return x;
    if (!cx->has[b]) {
        /* no gather, no prefetch of b-1, no release */
        w->d += (w->s1 - w->s0) + w->d2;
        w->s0 = w->s1 = 0;
        w->d2 = 0;
        w->pi = 0;
        return x;
    }
    int32_t lo = pt_pool_lo(w, b), hi = pt_pool_hi(w, b), pi = 0, phi = 0;
    pt_pool_run rs = pt_pool_acquire(w, lo + w->pi, hi, 0);
    x.sync = rs.miss;
    x.nsync = rs.nmiss;
    int prev = b >= 1 && cx->has[b - 1];
    if (prev) {
        int32_t plo = pt_pool_lo(w, b - 1);
        phi = pt_pool_hi(w, b - 1);
        pt_pool_run r = pt_pool_acquire(w, plo, phi < lo ? phi : lo, 1);
        pi = (int32_t)r.done;
        x.prefetch = r.miss;
        x.nprefetch = r.nmiss;
    }
    /* release(b): the chunks shared with b-1 first (the oldest stamps), then the rest */
    if (prev && phi > lo) {
        w->s0 = lo;
        w->s1 = phi;
    }
    w->d2 = (hi - lo) - (w->s1 - w->s0);
    w->pi = pi;
    return x;
}

#endif /* PT_COST_INTERNAL_H */
