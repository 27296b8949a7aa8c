/*
 * dist_grad.c — data parallel: the gradient of every trainable chunk becomes
 * the mean over the ranks (sum in rank order, times 1/world) before clipping
 * and before any optimizer work, so every rank clips by the same factor and
 * steps the same values.
 *
 * Where each chunk is reduced:
 *  - resident: in place in device memory (the MPI transport adds it with the
 *    CPU, right on the host backend where device memory is host memory; on cuda
 *    the NCCL transport works on the device buffer; a 16-bit resident gradient
 *    is refused for now). With [dist] overlap_allreduce (default) and the MPI
 *    transport the chunk is a bucket: after the step's last backward of its
 *    lowest block an event on the compute stream marks its gradient final, and
 *    as soon as a hook (or optimizer_step, waiting) sees the event complete, the
 *    chunk's nonblocking all-reduces start; they travel while the device runs
 *    the rest of backward, and optimizer_step waits for them before anything
 *    reads the gradient. Chunks holding non-block parameters (embeddings: their
 *    gradient is final only after the last backward) start in optimizer_step.
 *    NCCL matches collectives by the order ranks issue them, not by key, and a
 *    bucket starts whenever its rank's device gets there (between other
 *    collectives, e.g. mode C's): so with NCCL every gradient is reduced after
 *    backward, blocking, in layout order;
 *  - offloaded: on the host side, after its D2H copies and before CPU Adam, in
 *    its fp32 accumulator (always kept with several ranks): one fp32 reduction
 *    per step whatever the chunk's dtype and micro-batch count, no device
 *    buffer held for it, and the CPU Adam that follows reads exactly these bytes.
 * Both go region by region with the region's element count, in layout order,
 * so the messages are the same whichever chunks a rank keeps resident: ranks
 * whose plans differ (the search uses each rank's own timings) still match.
 * With [dist] tp_size = P > 1 the average runs over env.dp_coll instead: the
 * world / P ranks that hold the same shard of every split param (and the same
 * replicated params), one per tensor-parallel group; with world == P there is
 * none and nothing is reduced here, only the norms are taken.
 * Without tensor parallel, with overlap_allreduce an offloaded chunk is a
 * bucket too: it starts once the CPU task of the step's last micro-batch has
 * formed the sum (checked like the events).
 * Every region is one keyed all-reduce (the key is the region's index in the
 * layout, the same on every rank), so a rank whose plan keeps a chunk resident
 * (reduced early, during backward) matches a rank that offloads it (reduced in
 * optimizer_step): mode B tolerates ranks whose searches chose other knobs.
 * optimizer_step finishes the regions in layout order on every rank, so no
 * rank waits for a reduction another rank has not started yet. The sums are
 * the blocking all-reduce's, bit for bit, wherever they run. With tensor
 * parallel the regions are reduced blocking, in layout order, over env.dp_coll.
 *
 * Mode C (dist_shard.c): offloaded chunks were reduce-scattered at their backward
 * already, so only resident chunks are all-reduced here; for clipping, each
 * rank's partial squared norms of its parts are summed across the ranks once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "store_internal.h"


int pt_cs_tp_size(const pt_store *st) {
    return st->env.coll && st->env.cfg->tp_size > 1 ? st->env.cfg->tp_size : 1;
}

/* Region r of chunk c as a key (its index among the layout's regions). */
static int region_key(const pt_store *st, const cs_chunk *c, int r) {
    return (int)(c->lc->regions - st->lay.regions) + r;
}

/* Keyed all-reduces need one key per region, a transport that matches by key
 * (MPI: its messages carry the key), and a world to reduce over. */
static int keyed(const pt_store *st) {
    return st->env.coll && pt_coll_world(st->env.coll) > 1 && st->lay.n_regions <= PT_COLL_KEYS &&
           pt_cs_tp_size(st) <= 1 && !strcmp(pt_coll_transport(st->env.coll), "mpi");
}

static int buckets_on(const pt_store *st) {
    const pt_step_state *sx = st->env.sx;
    return keyed(st) && st->env.cfg->overlap_allreduce && !st->profiling && st->opt_ready &&
           !sx->eval && sx->micro == sx->n_micro - 1;
}

/* A chunk the buckets may take: an offloaded one of mode B (its fp32 sum), or
 * a resident one of a block with every trainable region fp32 (the refusal of
 * 16-bit ones stays in pt_cs_dist_reduce). */
static int bucketable(const cs_chunk *c) {
    if (!c->trainable || c->lc->block_first < 0 || c->sh) return 0;
    if (!c->persistent) return 1;
    for (int r = 0; r < c->lc->n_regions; r++)
        if (c->reg_state[r] != UINT64_MAX && c->lc->regions[r].dtype != PT_F32) return 0;
    return 1;
}

/* Start the all-reduce of region r of chunk c (its buffer: the fp32 sum of an
 * offloaded chunk, the device gradient of a resident one). */
static int start_region(pt_store *st, cs_chunk *c, int r, char *err, size_t errlen) {
    const pt_chunk_region *g = &c->lc->regions[r];
    int key = region_key(st, c, r);
    size_t n = (size_t)(g->bytes / pt_dtype_size(g->dtype));
    void *buf = c->persistent ? (char *)c->d_grad + g->offset : (void *)(c->h_gacc + c->reg_state[r]);
    char what[64];
    snprintf(what, sizeof what, "gradient of chunk %d", c->id);
    return pt_coll_iallreduce(st->env.coll, buf, n, PT_COLL_F32, 1.0 / pt_coll_world(st->env.coll),
                              key, what, &st->gop[key], err, errlen);
}

static int start_chunk(pt_store *st, cs_chunk *c, char *err, size_t errlen) {
    for (int r = 0; r < c->lc->n_regions; r++) {
        if (c->reg_state[r] == UINT64_MAX || st->gop[region_key(st, c, r)]) continue;
        int rc = start_region(st, c, r, err, errlen);
        if (rc) return rc;
    }
    return PT_OK;
}

int pt_cs_dist_bucket(pt_store *st, int32_t b, char *err, size_t errlen) {
    pt_store *ms = st;
    if (!buckets_on(st) || ms->lay.block_chunk_first[b] < 0) return PT_OK;
    if (!ms->gop) {
        ms->gop = calloc((size_t)ms->lay.n_regions + 1, sizeof *ms->gop);
        ms->ev_bkt = calloc((size_t)ms->n_chunks, sizeof *ms->ev_bkt);
        ms->bq = calloc((size_t)ms->n_chunks, sizeof *ms->bq);
        if (!ms->gop || !ms->ev_bkt || !ms->bq)
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    for (int k = ms->lay.block_chunk_first[b]; k <= ms->lay.block_chunk_last[b]; k++) {
        cs_chunk *c = &ms->ch[k];
        /* complete once its lowest block's backward has run */
        if (!bucketable(c) || c->lc->block_first != b) continue;
        /* offloaded: its CPU task (queued by the release just before) forms the
         * fp32 sum; the bucket waits for that task instead of an event */
        if (c->persistent && st->env.ordered) {
            if (!ms->ev_bkt[k] && OPS(st)->event_create(IMPL(st), &ms->ev_bkt[k]))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "event_create failed: cannot create device events");
            if (OPS(st)->event_record(IMPL(st), ms->ev_bkt[k], st->env.s_compute))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "marking the end of chunk %d's backward failed: event_record "
                               "failed",
                               c->id);
        }
        ms->bq[ms->bq_n++] = k;
    }
    return pt_cs_dist_poll(st, err, errlen);
}

/* Test every started reduction once (the transport moves large messages only
 * inside MPI calls, and a finished one forms its sum); *open: how many are not
 * finished. */
static int test_open(pt_store *st, int *open, char *err, size_t errlen) {
    *open = 0;
    for (int j = 0; j < st->lay.n_regions; j++) {
        int done = 1;
        int rc = st->gop[j] ? pt_coll_op_test(st->env.coll, st->gop[j], &done, err, errlen) : PT_OK;
        if (rc) return rc;
        *open += !done;
    }
    return PT_OK;
}

/* Start the queued chunks whose backward is done, in queue order (block = 1:
 * all of them, waiting for the device), and let started reductions finish. */
static int advance(pt_store *st, int block, char *err, size_t errlen) {
    pt_store *ms = st;
    if (!ms->bq_n) return PT_OK;
    while (ms->bq_started < ms->bq_n) {
        int k = ms->bq[ms->bq_started];
        cs_chunk *c = &ms->ch[k];
        /* resident: an asynchronous host may not have computed it yet (its event
         * says so); offloaded: its CPU task may still be forming the sum.
         * Skipped (testing): the gradient is sent as it is at the hook */
        int off = !c->persistent;
        if (off ? !(st->env.skip & PT_ORD_BUCKET) : pt_cs_ord(st, PT_ORD_BUCKET)) {
            int q = off ? pt_pool_pending(ms->workers, &c->tg) == 0
                        : OPS(st)->event_query(IMPL(st), ms->ev_bkt[k]);
            if (q < 0)
                return pt_fail(err, errlen, PT_ERR_BACKEND, "querying the end of chunk %d's "
                                                            "backward failed: event_query failed",
                               c->id);
            if (!q) {
                if (!block) break;
                /* the device is still on backward: started reductions are
                 * moved along (polled every 100 us) while any is unfinished;
                 * with none left, this thread sleeps until the device is there
                 * (polling would take CPU time from the compute) */
                int open = 0, rc = test_open(st, &open, err, errlen);
                if (rc) return rc;
                if (open) {
                    struct timespec ts = {0, 100000};
                    nanosleep(&ts, NULL);
                } else if (off) {
                    pt_pool_wait(ms->workers, &c->tg);   /* its status: wait_tasks reports it */
                } else if (OPS(st)->event_sync(IMPL(st), ms->ev_bkt[k])) {
                    return pt_fail(err, errlen, PT_ERR_BACKEND, "waiting for the end of chunk %d's "
                                                                "backward failed: event_sync failed",
                                   ms->ch[k].id);
                }
                continue;
            }
        }
        int rc = start_chunk(st, c, err, errlen);
        if (rc) return rc;
        ms->bq_started++;
        ms->bk_off += off;
        if (block) ms->bk_drain++;
        else ms->bk_hook++;
    }
    int open = 0;
    return block ? PT_OK : test_open(st, &open, err, errlen);   /* a hook: move them along */
}

int pt_cs_dist_poll(pt_store *st, char *err, size_t errlen) {
    return st->bq_n ? advance(st, 0, err, errlen) : PT_OK;
}

int pt_cs_dist_drain(pt_store *st, char *err, size_t errlen) {
    return st->bq_n ? advance(st, 1, err, errlen) : PT_OK;
}

void pt_cs_dist_fini(pt_store *st) {
    pt_store *ms = st;
    for (int j = 0; ms->gop && j < ms->lay.n_regions; j++) {
        pt_coll_op_free(st->env.coll, ms->gop[j]);
        ms->gop[j] = NULL;
    }
    for (int k = 0; ms->ev_bkt && k < ms->n_chunks; k++)
        if (ms->ev_bkt[k]) OPS(st)->event_destroy(IMPL(st), ms->ev_bkt[k]);
    free(ms->gop);
    free(ms->ev_bkt);
    free(ms->bq);
    ms->gop = NULL;
    ms->ev_bkt = NULL;
    ms->bq = NULL;
    ms->bq_n = ms->bq_started = ms->bk_hook = ms->bk_drain = ms->bk_off = 0;
}

/* Region r of chunk c reduced (its started operation finished, or one started
 * and finished now), the operation freed. */
static int finish_region(pt_store *st, cs_chunk *c, int r, char *err, size_t errlen) {
    int key = region_key(st, c, r);
    int rc = st->gop[key] ? PT_OK : start_region(st, c, r, err, errlen);
    if (!rc) rc = pt_coll_op_wait(st->env.coll, st->gop[key], err, errlen);
    pt_coll_op_free(st->env.coll, st->gop[key]);
    st->gop[key] = NULL;
    return rc;
}

int pt_cs_dist_reduce(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    int clip = pt_store_want_norms(st);
    /* tensor parallel: never average over the group (a split param's ranks hold
     * different blocks, and a replicated one's gradient is taken as the host
     * gives it: tensor-parallel hosts compute it identically on every rank of
     * the group), only over the replicas of this rank's shards, if any */
    pt_coll *dc = pt_cs_tp_size(st) > 1 ? st->env.dp_coll : st->env.coll;
    int tp = dc == NULL;   /* nothing to average */
    double scale = 1.0 / pt_coll_world(dc);
    /* every queued bucket started (waits for the device's backward of each) */
    int rc = pt_cs_dist_drain(st, err, errlen);
    if (rc) return rc;
    /* the host's last backward work on resident gradients is done before the CPU reads them */
    if (OPS(st)->stream_sync(IMPL(st), st->env.s_compute))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: stream_sync of the compute stream failed");
    if (keyed(st) && !ms->gop && !(ms->gop = calloc((size_t)ms->lay.n_regions + 1, sizeof *ms->gop)))
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    /* the time in the reductions from here on is exposed (backward is over):
     * what the cost model charges and calibration compares */
    double t0 = 0, busy = 0;
    char what[64];
    for (int k = 0; k < ms->n_chunks && !rc; k++) {
        cs_chunk *c = &ms->ch[k];
        if (!c->trainable) continue;
        if (c->sh) {   /* reduced at its backward (mode C): only its part's norms */
            if (clip) rc = pt_cs_chunk_norms_held(st, c, 1, err, errlen);
            continue;
        }
        snprintf(what, sizeof what, "gradient of chunk %d", c->id);
        for (int r = 0; !tp && r < c->lc->n_regions && !rc; r++) {
            const pt_chunk_region *g = &c->lc->regions[r];
            if (c->reg_state[r] == UINT64_MAX) continue;
            if (c->persistent && g->dtype != PT_F32) {
                rc = pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                             "optimizer_step: resident chunk %d holds 16-bit gradients; "
                             "reducing them across ranks is not built yet (fp32 parameters, "
                             "or 16-bit ones in offloaded chunks, are)",
                             c->id);
            } else if (keyed(st)) {
                t0 = pt_now_s();
                rc = finish_region(st, c, r, err, errlen);
                busy += pt_now_s() - t0;
            } else {   /* more regions than keys: blocking, in layout order on every rank */
                size_t n = (size_t)(g->bytes / pt_dtype_size(g->dtype));
                void *buf = c->persistent ? (char *)c->d_grad + g->offset
                                          : (void *)(c->h_gacc + c->reg_state[r]);
                t0 = pt_now_s();
                rc = pt_coll_allreduce(dc, buf, n, PT_COLL_F32, scale, what, err,
                                       errlen);
                busy += pt_now_s() - t0;
            }
        }
        if (!rc && !c->persistent && clip) pt_cs_chunk_norms(st, c, 1);
    }
    if (!rc && ms->bq_n && !ms->bk_logged) {
        ms->bk_logged = 1;
        PT_LOGI(st->env.lg, "gradient all-reduce: %d chunk(s) reduced in buckets while backward "
                            "ran (%d resident, %d offloaded; %d started at a block hook, %d while "
                            "optimizer_step waited for backward), the other gradients after it",
                ms->bq_n, ms->bq_n - ms->bk_off, ms->bk_off, ms->bk_hook, ms->bk_drain);
    }
    ms->bq_n = ms->bq_started = ms->bk_hook = ms->bk_drain = ms->bk_off = 0;
    t0 = pt_now_s();
    if (!rc && st->shard && clip) rc = pt_sh_norm_reduce(st, err, errlen);
    st->coll_s[0] += busy + pt_now_s() - t0;
    if (rc) pt_cs_dist_fini(st);   /* nothing may stay in flight on a failed step */
    return rc;
}
