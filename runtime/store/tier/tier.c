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

static uint64_t rec_words(const cs_chunk *c) { return (c->has16 ? 3u : 2u) * c->n_state; }

static uint64_t rec_len(const cs_chunk *c, uint64_t blk) {
    uint64_t b = rec_words(c) * 4;
    return (b + blk - 1) / blk * blk;
}

static uint64_t max_len(const pt_store *st) {
    uint64_t m = 0;
    for (int k = 0; k < st->n_chunks; k++) {
        uint64_t l = st->ch[k].tiered ? rec_len(&st->ch[k], st->env.cfg->nvme_block) : 0;
        if (l > m) m = l;
    }
    return m;
}

uint64_t pt_tier_staging_bytes(const pt_store *st, int rounded) {
    uint64_t one = max_len(st);
    if (!one) return 0;
    one += st->env.cfg->nvme_block;
    if (rounded) one = pt_gpu_round_size(one);
    return one * (uint64_t)st->env.cfg->nvme_slots;
}

/* Point chunk c's states at base (NULL: none). */
static void point(cs_chunk *c, float *base) {
    c->h_m = base;
    c->h_v = base ? base + c->n_state : NULL;
    c->h_master = base && c->has16 ? base + 2 * c->n_state : NULL;
}

/* Start wanted reads while a slot is free (mu held). The head of the queue
 * waits for its own chunk's write-back: a read must see the last step. */
static void dispatch(pt_tier *t) {
    while (t->qn) {
        int k = t->q[t->qh];
        if (t->cs[k] == TC_WRITING) return;
        int s = -1;
        for (int i = 0; i < t->n_slots && s < 0; i++)
            if (t->slot_chunk[i] < 0) s = i;
        if (s < 0) return;
        t->qh = (t->qh + 1) % t->st->n_chunks;
        t->qn--;
        t->slot_chunk[s] = k;
        t->slot[k] = s;
        t->cs[k] = TC_READING;
        t->jobs[(t->jh + t->jn++) % t->jcap] = (tier_job){0, k};
        pthread_cond_signal(&t->cv_job);
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
        uint64_t off = t->off[j.chunk], len = t->len[j.chunk];
        pthread_mutex_unlock(&t->mu);
        unsigned skip = t->st->env.skip & (j.write ? PT_ORD_TIER_WRITE : PT_ORD_TIER_READ);
        char e[512];
        double t0 = pt_now_s();
        int rc = skip ? PT_OK : pt_tier_rw(t, j.write, t->slot_mem[s], off, len, e, sizeof e);
        if (j.write && !rc && tried == t->st->env.cfg->debug_tier_fail_write)
            rc = pt_tier_io_fail(t, ENOSPC, "a write-back (testing: debug_tier_fail_write)", e,
                                 sizeof e);
        double dt = pt_now_s() - t0;
        pthread_mutex_lock(&t->mu);
        t->busy--;
        if (rc) fail_once(t, rc, e);
        if (j.write) {
            t->wr_bytes += len, t->wr_s += dt, t->writes++;
            t->slot_chunk[s] = -1;
            t->slot[j.chunk] = -1;
            t->cs[j.chunk] = TC_IDLE;
            dispatch(t);
        } else {
            t->rd_bytes += len, t->rd_s += dt, t->reads++;
            t->cs[j.chunk] = TC_READY;
        }
        pthread_cond_broadcast(&t->cv_done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Queue chunk k's read unless it is queued or in a slot already (mu held). */
static void want(pt_tier *t, int k) {
    if (t->wq[k]) return;
    t->wq[k] = 1;   /* until its step ends */
    t->q[(t->qh + t->qn++) % t->st->n_chunks] = k;
    dispatch(t);
}

void pt_tier_want(pt_store *st, cs_chunk *c) {
    pt_tier *t = st->tier;
    pthread_mutex_lock(&t->mu);
    want(t, c->id);
    pthread_mutex_unlock(&t->mu);
}

int pt_tier_begin(pt_store *st, cs_chunk *c) {
    pt_tier *t = st->tier;
    int k = c->id;
    pthread_mutex_lock(&t->mu);
    want(t, k);
    double t0 = pt_now_s();
    while (t->cs[k] != TC_READY) pthread_cond_wait(&t->cv_done, &t->mu);
    t->wait_s += pt_now_s() - t0;
    t->cs[k] = TC_STEPPING;
    point(c, (float *)t->slot_mem[t->slot[k]]);
    int rc = t->err_rc;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void pt_tier_end(pt_store *st, cs_chunk *c, int write) {
    pt_tier *t = st->tier;
    int k = c->id;
    pthread_mutex_lock(&t->mu);
    point(c, NULL);
    t->wq[k] = 0;
    if (write && !t->err_rc) {
        t->cs[k] = TC_WRITING;
        t->jobs[(t->jh + t->jn++) % t->jcap] = (tier_job){1, k};
        pthread_cond_signal(&t->cv_job);
    } else {
        t->slot_chunk[t->slot[k]] = -1;
        t->slot[k] = -1;
        t->cs[k] = TC_IDLE;
        dispatch(t);
        pthread_cond_broadcast(&t->cv_done);
    }
    pthread_mutex_unlock(&t->mu);
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

int pt_tier_failed(pt_store *st, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    if (!t) return PT_OK;
    pthread_mutex_lock(&t->mu);
    int rc = t->err_rc;
    if (rc) pt_fail(err, errlen, rc, "%s", t->err);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Chunk k's record into a fresh view (or zeroed), pointed at by its h_m, h_v,
 * h_master; the caller has waited for every step and I/O of the chunk. */
static int view_one(pt_tier *t, int k, int fill, char *err, size_t errlen) {
    void *p = NULL;
    if (posix_memalign(&p, (size_t)t->blk, (size_t)t->len[k]))
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    t->view[k] = p;
    memset(p, 0, (size_t)t->len[k]);
    point(&t->st->ch[k], p);
    return fill ? pt_tier_rw(t, 0, p, t->off[k], t->len[k], err, errlen) : PT_OK;
}

int pt_tier_chunk_open(pt_store *st, cs_chunk *c, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    int k = c->id;
    pthread_mutex_lock(&t->mu);
    while (t->cs[k] != TC_IDLE || t->wq[k]) pthread_cond_wait(&t->cv_done, &t->mu);
    int rc = t->err_rc;
    if (rc) pt_fail(err, errlen, rc, "%s", t->err);
    pthread_mutex_unlock(&t->mu);
    if (!rc && (rc = view_one(t, k, 1, err, errlen))) pt_tier_chunk_close(st, c, 0, NULL, 0);
    return rc;
}

int pt_tier_chunk_close(pt_store *st, cs_chunk *c, int store, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    int k = c->id, rc = PT_OK;
    if (!t->view[k]) return PT_OK;
    if (store) rc = pt_tier_rw(t, 1, t->view[k], t->off[k], t->len[k], err, errlen);
    free(t->view[k]);
    t->view[k] = NULL;
    point(c, NULL);
    return rc;
}

int pt_tier_views_open(pt_store *st, int fill, char *err, size_t errlen) {
    pt_tier *t = st->tier;
    if (!t) return PT_OK;
    int rc = pt_tier_sync(st, err, errlen);
    if (rc) return rc;
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        if (!c->tiered) continue;
        if ((rc = view_one(t, k, fill, err, errlen))) {
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
        if (!t->view[k]) continue;
        if (store && !rc) rc = pt_tier_rw(t, 1, t->view[k], t->off[k], t->len[k], err, errlen);
        free(t->view[k]);
        t->view[k] = NULL;
        point(&st->ch[k], NULL);
    }
    return rc;
}

static int alloc_arrays(pt_tier *t, int n, int n_slots) {
    t->off = calloc((size_t)n, sizeof *t->off);
    t->len = calloc((size_t)n, sizeof *t->len);
    t->cs = calloc((size_t)n, sizeof *t->cs);
    t->slot = calloc((size_t)n, sizeof *t->slot);
    t->q = calloc((size_t)n, sizeof *t->q);
    t->wq = calloc((size_t)n, sizeof *t->wq);
    t->view = calloc((size_t)n, sizeof *t->view);
    t->jcap = n + n_slots;
    t->jobs = calloc((size_t)t->jcap, sizeof *t->jobs);
    t->slot_alloc = calloc((size_t)n_slots, sizeof *t->slot_alloc);
    t->slot_mem = calloc((size_t)n_slots, sizeof *t->slot_mem);
    t->slot_chunk = calloc((size_t)n_slots, sizeof *t->slot_chunk);
    return t->off && t->len && t->cs && t->slot && t->q && t->wq && t->view && t->jobs && t->slot_alloc &&
           t->slot_mem && t->slot_chunk;
}

int pt_tier_open(pt_store *st, char *err, size_t errlen) {
    const pt_config *cfg = st->env.cfg;
    pt_tier *t = calloc(1, sizeof *t);
    if (!t) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    t->st = st;
    t->fd = t->lock_fd = -1;
    t->blk = cfg->nvme_block;
    t->budget = cfg->nvme_budget;
    t->n_slots = cfg->nvme_slots;
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
        t->off[k] = t->total;
        t->len[k] = rec_len(c, t->blk);
        t->total += t->len[k];
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
    PT_LOGI(st->env.lg, "nvme tier: %d chunk(s)' optimizer states in %s (%.2f MiB, %s I/O, "
                        "block %llu), %d staging slot(s) of %.2f MiB pinned, %d I/O thread(s); one record "
                        "written in %.3f ms (%.0f MB/s), read in %.3f ms (%.0f MB/s)",
            n, t->file,
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
    for (int k = 0; k < st->n_chunks; k++)
        if (st->ch[k].tiered) point(&st->ch[k], NULL);
    free(t->off), free(t->len), free(t->cs), free(t->slot), free(t->q), free(t->wq), free(t->view);
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
    out->level = 1;
    pthread_mutex_unlock(&t->mu);
}
