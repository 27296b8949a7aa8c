/*
 * tier.c — the disk tier's staging slots, its I/O threads and the views of
 * state images (tier.h says how a step passes through it).
 *
 * Record of chunk c: words w = 2 (m, v) or 3 (and the masters of 16-bit
 * regions) times E = n_state fp32 elements, len = ceil(4 w E / block) * block
 * bytes at the sum of the earlier records' lengths. A slot is the largest len
 * plus one block (its start aligned to the block for O_DIRECT).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tier_int.h"

/* Byte offsets of chunk c's sections in its record at level lv, each section
 * 64-byte aligned (the CPU kernels' vector loads), UINT64_MAX where there is
 * none; returns the record's bytes before padding to the block. A mode C
 * chunk's record holds this rank's parts (E = its part's elements, the
 * landing zone in fp32). */
static uint64_t layout(const cs_chunk *c, int lv, tier_sec *o) {
    const uint64_t none = UINT64_MAX, e4 = (uint64_t)c->n_state * 4;
    const uint64_t pb = c->sh ? c->sh->p_bytes : c->used, gb = c->sh ? e4 : c->used;
    uint64_t at = 0;
#define PUT(f, n) (o->f = at, at += ((n) + 63) / 64 * 64)
    o->param = o->gstage = o->m = o->v = o->master = o->gacc = none;
    if (lv == 2) PUT(param, pb);
    if (c->trainable && lv == 2) PUT(gstage, gb);
    if (c->trainable) PUT(m, e4), PUT(v, e4);
    if (c->trainable && c->has16) PUT(master, e4);
    if (c->trainable && lv == 2) PUT(gacc, e4);
#undef PUT
    return at;
}

static uint64_t rec_len(const cs_chunk *c, int lv, uint64_t blk) {
    tier_sec o;
    uint64_t b = layout(c, lv, &o);
    return (b + blk - 1) / blk * blk;
}

static uint64_t max_len(const pt_store *st) {
    uint64_t m = 0;
    for (int k = 0; k < st->n_chunks; k++) {
        const cs_chunk *c = &st->ch[k];
        uint64_t l = c->tiered ? rec_len(c, c->tiered, st->env.cfg->nvme_block) : 0;
        if (l > m) m = l;
    }
    return m;
}

uint64_t pt_tier_staging_bytes(const pt_store *st, int rounded) {
    uint64_t one = max_len(st);
    if (!one) return 0;
    one += st->env.cfg->nvme_block;
    if (rounded) one = pt_gpu_round_size(one);
    return one * (uint64_t)st->tier_slots;
}

int pt_tier_level(const pt_store *st) { return st->tier ? st->tier->level : 0; }

/* A pointer field changed only when its value does: a holder reading it on
 * another thread while a second holder takes the same image sees no write. */
static void setp(void **f, void *v) {
    if (*f != v) *f = v;
}

/* Point chunk k's host buffers that live in the record at base (NULL: none). */
static void point(pt_tier *t, int k, char *base) {
    cs_chunk *c = &t->st->ch[k];
    const tier_sec *o = &t->sec[k];
#define AT(f) (base && o->f != UINT64_MAX ? (void *)(base + o->f) : NULL)
    setp((void **)&c->h_m, AT(m));
    setp((void **)&c->h_v, AT(v));
    setp((void **)&c->h_master, AT(master));
    if (t->level == 2) {
        setp(&c->h_param, AT(param));
        setp(&c->h_gstage, AT(gstage));
        setp((void **)&c->h_gacc, AT(gacc));
    }
#undef AT
}

static void q_push(pt_tier *t, int k) {
    t->queued[k] = 1;
    t->q[(t->qh + t->qn++) % t->st->n_chunks] = k;
}

/* Take chunk k out of the queue of images waiting for a slot. */
static void q_remove(pt_tier *t, int k) {
    int n = t->st->n_chunks;
    for (int i = 0; i < t->qn; i++) {
        if (t->q[(t->qh + i) % n] != k) continue;
        for (int j = i; j < t->qn - 1; j++) t->q[(t->qh + j) % n] = t->q[(t->qh + j + 1) % n];
        t->qn--;
        break;
    }
    t->queued[k] = 0;
}

/* A slot for the next image: a free one, else the least recently used clean
 * image nobody holds; for an image somebody waits for, else also a clean one
 * that is held but not in use yet (a step queued behind the waiter, a read
 * ahead), which goes back to the queue. -1: none. */
static int find_slot(pt_tier *t, int waited) {
    uint64_t best = UINT64_MAX;
    int s = -1;
    for (int i = 0; i < t->n_slots; i++)
        if (t->slot_chunk[i] < 0) return i;
    for (int i = 0; i < t->n_slots; i++) {
        int j = t->slot_chunk[i];
        if (t->ref[j] || t->cs[j] != TC_READY || t->dirty[j] || t->lru[j] >= best) continue;
        best = t->lru[j];
        s = i;
    }
    for (int i = 0; i < t->n_slots && s < 0 && waited; i++) {
        int j = t->slot_chunk[i];
        if (t->ref[j] && !t->use[j] && !t->waiting[j] && t->cs[j] == TC_READY && !t->dirty[j]) s = i;
    }
    if (s < 0) return -1;
    int j = t->slot_chunk[s];   /* out: the file holds what the slot did */
    t->cs[j] = TC_IDLE;
    t->valid[j] = 0;
    t->slot[j] = -1;
    t->slot_chunk[s] = -1;
    if (t->ref[j]) q_push(t, j);   /* still held: it waits for a slot again */
    return s;
}

/* Read what chunk k's holders need and its slot lacks (mu held): the
 * parameters' blocks for an upload, the rest (or all) for anything else. */
static void start_read(pt_tier *t, int k) {
    int upto = t->need[k] >= 2 ? 2 : 1;
    uint64_t from = t->valid[k] >= 1 ? t->plen[k] : 0, to = upto == 2 ? t->len[k] : t->plen[k];
    if (from >= to) {   /* nothing to read (level 1: the parameters are not in it) */
        t->valid[k] = upto;
        t->cs[k] = TC_READY;
        return;
    }
    t->cs[k] = TC_READING;
    t->jobs[(t->jh + t->jn++) % t->jcap] = (tier_job){0, k, from, to, upto};
    pthread_cond_signal(&t->cv_job);
}

/* Give held images slots and start their reads (mu held): first an image a
 * thread waits for (a step task, a device copy being queued), then the
 * others in the order they were first held, while slots can be had.
 *
 * Why it cannot deadlock: an image in use (its holder asked for its address
 * or its contents) is never taken from its slot, and every such holder
 * finishes without waiting for another slot: a task steps the chunk, a device
 * copy runs on its stream behind work of chunks that are in use too. So the
 * slots in use come free, and a thread that waits gets the next free, clean
 * or not-yet-used slot before any read ahead does. */
static void dispatch(pt_tier *t) {
    while (t->qn) {
        int k = -1;
        for (int i = 0; i < t->qn && k < 0; i++) {
            int j = t->q[(t->qh + i) % t->st->n_chunks];
            if (t->waiting[j]) k = j;
        }
        int s = find_slot(t, k >= 0);
        if (k < 0) k = t->q[t->qh];
        if (s < 0) return;
        q_remove(t, k);
        t->slot_chunk[s] = k;
        t->slot[k] = s;
        t->valid[k] = 0;
        start_read(t, k);
        pthread_cond_broadcast(&t->cv_done);
    }
}

static void fail_once(pt_tier *t, int rc, const char *e) {
    if (t->err_rc) return;
    t->err_rc = rc;
    snprintf(t->err, sizeof t->err, "%s", e);
}

static void *io_main(void *arg) {
    pt_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->jn && !t->stop) pthread_cond_wait(&t->cv_job, &t->mu);
        if (!t->jn) break;
        tier_job j = t->jobs[t->jh];
        t->jh = (t->jh + 1) % t->jcap;
        t->jn--;
        t->busy++;
        int64_t tried = j.write ? ++t->tried : 0;
        int s = t->slot[j.chunk];
        uint64_t off = t->off[j.chunk] + j.from, len = j.to - j.from;
        pthread_mutex_unlock(&t->mu);
        unsigned skip = t->st->env.skip & (j.write ? PT_ORD_TIER_WRITE : PT_ORD_TIER_READ);
        char e[512];
        double t0 = pt_now_s();
        int rc = skip ? PT_OK : pt_tier_rw(t, j.write, t->slot_mem[s] + j.from, off, len, e, sizeof e);
        if (j.write && !rc && tried == t->st->env.cfg->debug_tier_fail_write)
            rc = pt_tier_io_fail(t, ENOSPC, "a write-back (testing: debug_tier_fail_write)", e,
                                 sizeof e);
        double dt = pt_now_s() - t0;
        pthread_mutex_lock(&t->mu);
        t->busy--;
        if (rc) fail_once(t, rc, e);
        if (j.write) t->wr_bytes += len, t->wr_s += dt, t->writes++;
        else t->rd_bytes += len, t->rd_s += dt, t->reads++;
        /* the slot holds the image, now clean: a later hold finds it there
         * (a read of the parameters alone goes on where a holder came since
         * that needs the rest) */
        t->cs[j.chunk] = TC_READY;
        t->lru[j.chunk] = ++t->tick;
        if (!j.write) t->valid[j.chunk] = j.upto;
        if (t->valid[j.chunk] < t->need[j.chunk]) start_read(t, j.chunk);
        dispatch(t);
        pthread_cond_broadcast(&t->cv_done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void hold(pt_tier *t, int k, int need) {
    t->ref[k]++;
    if (need > t->need[k]) t->need[k] = need;
    if (t->cs[k] == TC_IDLE && !t->queued[k]) {
        q_push(t, k);
        dispatch(t);
    } else if (t->cs[k] == TC_READY && t->valid[k] < t->need[k]) {
        start_read(t, k);   /* in its slot with the parameters only */
    }
}

/* Wait (mu held) until chunk k has a slot, or with ready its image is in it;
 * then it is in use until its last holder drops it. */
static void await(pt_tier *t, int k, int ready) {
    double t0 = pt_now_s();
    t->waiting[k]++;
    dispatch(t);   /* a waiter goes first */
    while (t->slot[k] < 0 || (ready && (t->cs[k] != TC_READY || t->valid[k] < 2)))
        pthread_cond_wait(&t->cv_done, &t->mu);
    t->waiting[k]--;
    t->use[k] = 1;
    t->wait_s += pt_now_s() - t0;
    point(t, k, t->slot_mem[t->slot[k]]);
}

void pt_tier_hold(pt_store *st, cs_chunk *c) {
    pt_tier *t = st->tier;
    pthread_mutex_lock(&t->mu);
    hold(t, c->id, 2);
    pthread_mutex_unlock(&t->mu);
}

void pt_tier_hold_params(pt_store *st, cs_chunk *c) {
    pt_tier *t = st->tier;
    pthread_mutex_lock(&t->mu);
    hold(t, c->id, 1);
    pthread_mutex_unlock(&t->mu);
}

void pt_tier_slot(pt_store *st, cs_chunk *c) {
    pt_tier *t = st->tier;
    int k = c->id;
    pthread_mutex_lock(&t->mu);
    await(t, k, 0);
    pthread_mutex_unlock(&t->mu);
}

int pt_tier_ready(pt_store *st, cs_chunk *c) {
    pt_tier *t = st->tier;
    int k = c->id;
    pthread_mutex_lock(&t->mu);
    await(t, k, 1);
    int rc = t->err_rc;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void pt_tier_drop(pt_store *st, cs_chunk *c, int how) {
    pt_tier *t = st->tier;
    int k = c->id;
    pthread_mutex_lock(&t->mu);
    if (how == PT_TIER_DIRTY) t->dirty[k] = 1;
    if (how == PT_TIER_DISCARD) t->discard[k] = 1;
    if (--t->ref[k] == 0) {
        point(t, k, NULL);
        t->use[k] = t->need[k] = 0;
        if (t->cs[k] == TC_IDLE) {   /* never got a slot: leave the queue */
            q_remove(t, k);
        } else if (t->cs[k] == TC_READY && (t->discard[k] || (t->dirty[k] && t->err_rc))) {
            /* its changes are not to be kept (a failed step, or the tier already
             * failed): the file keeps the last good image */
            t->slot_chunk[t->slot[k]] = -1;
            t->slot[k] = -1;
            t->cs[k] = TC_IDLE;
            t->valid[k] = 0;
        } else if (t->cs[k] == TC_READY && t->dirty[k]) {
            t->cs[k] = TC_WRITING;
            t->jobs[(t->jh + t->jn++) % t->jcap] = (tier_job){1, k, 0, t->len[k], 2};
            pthread_cond_signal(&t->cv_job);
        } else if (t->cs[k] == TC_READY) {
            t->lru[k] = ++t->tick;
        }   /* reading: it becomes a clean image when the read ends */
        t->dirty[k] = t->discard[k] = 0;
        dispatch(t);
    }
    pthread_cond_broadcast(&t->cv_done);
    pthread_mutex_unlock(&t->mu);
}

/* On a device stream, ahead of a copy into or out of chunk c's slot: the
 * image is in the slot (its read, or a write-back of it, done). */
void pt_tier_stream_ready(void *arg) {
    cs_chunk *c = arg;
    pt_tier *t = c->owner->tier;
    pthread_mutex_lock(&t->mu);
    double t0 = pt_now_s();
    /* (a holder whose copy failed to queue may have dropped it since: then
     * nothing is copied behind this and the wait ends) */
    while (t->cs[c->id] == TC_READING || t->cs[c->id] == TC_WRITING)
        pthread_cond_wait(&t->cv_done, &t->mu);
    t->wait_s += pt_now_s() - t0;
    pthread_mutex_unlock(&t->mu);
}

/* On the h2d stream after an upload from chunk c's slot: its hold is dropped. */
void pt_tier_stream_drop(void *arg) {
    cs_chunk *c = arg;
    pt_tier_drop(c->owner, c, PT_TIER_CLEAN);
}

int pt_tier_sync(pt_store *st, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    if (!t) return PT_OK;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        int active = t->jn || t->busy;
        for (int k = 0; !active && k < st->n_chunks; k++)
            active = t->cs[k] == TC_WRITING || t->cs[k] == TC_READING;
        if (!active) break;
        pthread_cond_wait(&t->cv_done, &t->mu);
    }
    int rc = t->err_rc;
    if (rc) pt_fail(err, errlen, rc, "%s", t->err);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* A read queued ahead of a step that then did not come (a failed hook) is
 * dropped before a view, which needs the image out of every slot. */
static void forget_ahead(pt_store *st, int k) {
    cs_chunk *c = &st->ch[k];
    if (!c->tier_ahead) return;
    c->tier_ahead = 0;
    pt_tier_drop(st, c, PT_TIER_CLEAN);
}

int pt_tier_make_room(pt_store *st, uint64_t bytes, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    if (!t || st->env.cfg->nvme_slots > 0 || t->n_slots <= 3) return PT_OK;
    pt_gpu_usage u;
    pt_gpu_usage_get(st->env.gpu, &u);
    uint64_t lim = pt_ms_pinned_limit(st), per = t->slot_bytes + t->blk;
    if (u.pinned_current + bytes <= lim) return PT_OK;
    int keep = t->n_slots;
    while (keep > 3 && u.pinned_current + bytes > lim + (uint64_t)(t->n_slots - keep) * per) keep--;
    /* nothing may hold an image: every chunk's tasks, then the I/O */
    for (int k = 0; k < st->n_chunks; k++) {
        pt_pool_wait(st->workers, &st->ch[k].sg);
        pt_pool_wait(st->workers, &st->ch[k].tg);
        forget_ahead(st, k);
    }
    int rc = pt_tier_sync(st, err, errlen);
    if (rc) return rc;
    pthread_mutex_lock(&t->mu);
    for (int i = keep; i < t->n_slots; i++) {   /* (a copy's hold may still be on a stream) */
        int j = t->slot_chunk[i];
        while (j >= 0 && (t->ref[j] || t->cs[j] == TC_READING || t->cs[j] == TC_WRITING)) {
            pthread_cond_wait(&t->cv_done, &t->mu);
            j = t->slot_chunk[i];
        }
    }
    for (int i = keep; i < t->n_slots; i++) {
        int j = t->slot_chunk[i];
        if (j >= 0) t->cs[j] = TC_IDLE, t->slot[j] = -1, t->valid[j] = 0;   /* clean: the file holds it */
        pt_gpu_pinned_free(st->env.gpu, t->slot_alloc[i]);
        t->slot_alloc[i] = NULL, t->slot_mem[i] = NULL, t->slot_chunk[i] = -1;
    }
    PT_LOGI(st->env.lg, "nvme tier: %d staging slot(s) instead of %d, so the %llu bytes of fp32 "
                        "gradient sums fit [memory] pinned_budget",
            keep, t->n_slots, (unsigned long long)bytes);
    t->n_slots = keep;
    st->tier_slots = keep;
    pthread_mutex_unlock(&t->mu);
    return PT_OK;
}

int pt_tier_failed(pt_store *st, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    if (!t) return PT_OK;
    pthread_mutex_lock(&t->mu);
    int rc = t->err_rc;
    if (rc) pt_fail(err, errlen, rc, "%s", t->err);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Chunk k out of the slots, nobody holding it, its I/O done, so the file is
 * its only copy (mu not held). */
static int settle(pt_tier *t, int k, char *err, size_t errlen) {
    forget_ahead(t->st, k);
    pthread_mutex_lock(&t->mu);
    while (t->ref[k] || t->cs[k] == TC_READING || t->cs[k] == TC_WRITING)
        pthread_cond_wait(&t->cv_done, &t->mu);
    if (t->slot[k] >= 0) {
        t->slot_chunk[t->slot[k]] = -1;
        t->slot[k] = -1;
        t->cs[k] = TC_IDLE;
        t->valid[k] = 0;
        dispatch(t);
    }
    int rc = t->err_rc;
    if (rc) pt_fail(err, errlen, rc, "%s", t->err);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Chunk k's record into a fresh view (or zeroed), its host pointers at it. */
static int view_one(pt_tier *t, int k, int fill, char *err, size_t errlen) {
    int rc = settle(t, k, err, errlen);
    if (rc) return rc;
    void *p = NULL;
    if (posix_memalign(&p, (size_t)t->blk, (size_t)t->len[k]))
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    t->view[k] = p;
    memset(p, 0, (size_t)t->len[k]);
    pthread_mutex_lock(&t->mu);
    point(t, k, p);
    pthread_mutex_unlock(&t->mu);
    return fill ? pt_tier_rw(t, 0, p, t->off[k], t->len[k], err, errlen) : PT_OK;
}

static int view_close(pt_tier *t, int k, int store, char *err, size_t errlen) {
    int rc = PT_OK;
    if (!t->view[k]) return PT_OK;
    if (store) rc = pt_tier_rw(t, 1, t->view[k], t->off[k], t->len[k], err, errlen);
    free(t->view[k]);
    t->view[k] = NULL;
    pthread_mutex_lock(&t->mu);
    point(t, k, NULL);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int pt_tier_chunk_open(pt_store *st, cs_chunk *c, int fill, char *err, size_t errlen) {
    int rc = view_one(st->tier, c->id, fill, err, errlen);
    if (rc) view_close(st->tier, c->id, 0, NULL, 0);
    return rc;
}

int pt_tier_chunk_close(pt_store *st, cs_chunk *c, int store, char *err, size_t errlen) {
    return view_close(st->tier, c->id, store, err, errlen);
}

int pt_tier_views_open(pt_store *st, int fill, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    if (!t) return PT_OK;
    for (int k = 0; k < st->n_chunks; k++) {
        if (!st->ch[k].tiered) continue;
        int rc = view_one(t, k, fill, err, errlen);
        if (rc) {
            pt_tier_views_close(st, 0, NULL, 0);
            return rc;
        }
    }
    return PT_OK;
}

int pt_tier_views_close(pt_store *st, int store, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    if (!t) return PT_OK;
    int rc = PT_OK;
    for (int k = 0; k < st->n_chunks; k++) {
        int r = view_close(t, k, store && !rc, err, errlen);
        if (!rc) rc = r;
    }
    return rc;
}

static int alloc_arrays(pt_tier *t, int n, int n_slots) {
#define ARR(f) (t->f = calloc((size_t)n, sizeof *t->f)) != NULL
    int ok = ARR(off) && ARR(len) && ARR(cs) && ARR(slot) && ARR(q) && ARR(ref) && ARR(queued) &&
             ARR(dirty) && ARR(discard) && ARR(lru) && ARR(view) && ARR(sec) && ARR(use) &&
             ARR(waiting) && ARR(valid) && ARR(need) && ARR(plen);
#undef ARR
    t->jcap = n + n_slots;
    t->jobs = calloc((size_t)t->jcap, sizeof *t->jobs);
    t->slot_alloc = calloc((size_t)n_slots, sizeof *t->slot_alloc);
    t->slot_mem = calloc((size_t)n_slots, sizeof *t->slot_mem);
    t->slot_chunk = calloc((size_t)n_slots, sizeof *t->slot_chunk);
    return ok && t->jobs && t->slot_alloc && t->slot_mem && t->slot_chunk;
}

int pt_tier_open(pt_store *st, char *err, size_t errlen) {
    const pt_config *cfg = st->env.cfg;
    pt_tier *t = calloc(1, sizeof *t);
    if (!t) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    t->st = st;
    t->fd = t->lock_fd = -1;
    t->blk = cfg->nvme_block;
    t->budget = cfg->nvme_budget;
    t->n_slots = st->tier_slots;
    snprintf(t->dir, sizeof t->dir, "%s", cfg->nvme_path);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv_job, NULL);
    pthread_cond_init(&t->cv_done, NULL);
    st->tier = t;
    if (!alloc_arrays(t, st->n_chunks, t->n_slots)) {
        pt_tier_close(st);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        t->slot[k] = -1;
        if (!c->tiered) continue;
        t->level = c->tiered;
        layout(c, c->tiered, &t->sec[k]);
        t->off[k] = t->total;
        t->len[k] = rec_len(c, c->tiered, t->blk);
        t->total += t->len[k];
        /* level 2: the parameters' blocks (an upload reads only those) */
        uint64_t pe = t->sec[k].gstage != UINT64_MAX ? t->sec[k].gstage : t->len[k];
        t->plen[k] = c->tiered == 2 ? (pe + t->blk - 1) / t->blk * t->blk : t->len[k];
        if (t->plen[k] > t->len[k]) t->plen[k] = t->len[k];
    }
    int rc = pt_tier_file_open(t, st->rank, err, errlen);
    if (rc) {
        pt_tier_close(st);
        return rc;
    }
    t->slot_bytes = max_len(st);
    for (int i = 0; i < t->n_slots; i++) {
        t->slot_chunk[i] = -1;
        rc = pt_gpu_pinned_alloc(st->env.gpu, (size_t)(t->slot_bytes + t->blk), &t->slot_alloc[i],
                                 err, errlen);
        if (rc) {
            pt_tier_close(st);
            return rc;
        }
        uintptr_t a = (uintptr_t)t->slot_alloc[i];
        t->slot_mem[i] = (char *)((a + t->blk - 1) / t->blk * t->blk);
    }
    /* the disk's rates at one record (the largest, through a staging slot; the
     * initial fill at create_optimizer overwrites it): what one step's read and
     * write-back cost; logged, not yet a planner input */
    double w0 = pt_now_s(), wr_s = 0, rd_s = 0;
    memset(t->slot_mem[0], 0, (size_t)t->slot_bytes);
    if (!(rc = pt_tier_rw(t, 1, t->slot_mem[0], 0, t->slot_bytes, err, errlen))) {
        wr_s = pt_now_s() - w0;
        w0 = pt_now_s();
        rc = pt_tier_rw(t, 0, t->slot_mem[0], 0, t->slot_bytes, err, errlen);
        rd_s = pt_now_s() - w0;
    }
    if (rc) {
        pt_tier_close(st);
        return rc;
    }
    t->probe_rd_bps = rd_s > 0 ? t->slot_bytes / rd_s : 0;
    t->probe_wr_bps = wr_s > 0 ? t->slot_bytes / wr_s : 0;
    t->n_th = cfg->nvme_io_threads;
    if (!(t->th = calloc((size_t)t->n_th, sizeof *t->th))) {
        pt_tier_close(st);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    for (int i = 0; i < t->n_th; i++)
        if (pthread_create(&t->th[i], NULL, io_main, t)) {
            t->n_th = i;
            pt_tier_close(st);
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "[nvme] cannot start an I/O thread");
        }
    int n = 0;
    for (int k = 0; k < st->n_chunks; k++) n += st->ch[k].tiered;
    PT_LOGI(st->env.lg, "nvme tier: level %d, %d chunk(s)' %s in %s (%.2f MiB, %s I/O, "
                        "block %llu), %d staging slot(s) of %.2f MiB pinned, %d I/O thread(s); one record "
                        "written in %.3f ms (%.0f MB/s), read in %.3f ms (%.0f MB/s)",
            t->level, n, t->level == 1 ? "optimizer states" : "whole images", t->file,
            t->total / 1048576.0, t->direct ? "O_DIRECT" : "buffered (O_DIRECT refused here)",
            (unsigned long long)t->blk, t->n_slots, t->slot_bytes / 1048576.0, t->n_th,
            wr_s * 1e3, wr_s > 0 ? t->slot_bytes / wr_s / 1e6 : 0.0, rd_s * 1e3,
            rd_s > 0 ? t->slot_bytes / rd_s / 1e6 : 0.0);
    return PT_OK;
}

void pt_tier_close(pt_store *st) {
    pt_tier *t = st->tier;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->cv_job);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->n_th; i++) pthread_join(t->th[i], NULL);
    if (t->reads || t->writes) {
        pt_gpu_usage u;
        pt_gpu_usage_get(st->env.gpu, &u);
        PT_LOGI(st->env.lg, "nvme tier: %lld read(s) %.2f MiB in %.3f s, %lld write(s) %.2f MiB "
                            "in %.3f s (I/O thread seconds); the steps waited %.3f s for their states (the "
                            "read, and a free slot before it); pinned peak %llu bytes (budget %llu)",
                (long long)t->reads, t->rd_bytes / 1048576.0, t->rd_s, (long long)t->writes,
                t->wr_bytes / 1048576.0, t->wr_s, t->wait_s, (unsigned long long)u.pinned_peak,
                (unsigned long long)u.pinned_budget);
    }
    pt_tier_file_close(t);
    for (int k = 0; t->view && k < st->n_chunks; k++) free(t->view[k]);
    for (int i = 0; t->slot_alloc && i < t->n_slots; i++)
        pt_gpu_pinned_free(st->env.gpu, t->slot_alloc[i]);
    for (int k = 0; t->sec && k < st->n_chunks; k++)
        if (st->ch[k].tiered) point(t, k, NULL);
    free(t->off), free(t->len), free(t->cs), free(t->slot), free(t->q), free(t->view);
    free(t->ref), free(t->queued), free(t->dirty), free(t->discard), free(t->lru), free(t->sec);
    free(t->use), free(t->waiting), free(t->valid), free(t->need), free(t->plen);
    free(t->jobs), free(t->slot_alloc), free(t->slot_mem), free(t->slot_chunk), free(t->th);
    pthread_cond_destroy(&t->cv_job);
    pthread_cond_destroy(&t->cv_done);
    pthread_mutex_destroy(&t->mu);
    free(t);
    st->tier = NULL;
}

void pt_tier_get_counters(const pt_store *st, pt_tier_counters *out) {
    memset(out, 0, sizeof *out);
    pt_tier *t = st->tier;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    out->rd_bytes = t->rd_bytes, out->wr_bytes = t->wr_bytes;
    out->reads = t->reads, out->writes = t->writes;
    out->rd_s = t->rd_s, out->wr_s = t->wr_s, out->wait_s = t->wait_s;
    out->probe_rd_bps = t->probe_rd_bps, out->probe_wr_bps = t->probe_wr_bps;
    out->level = t->level;
    pthread_mutex_unlock(&t->mu);
}
