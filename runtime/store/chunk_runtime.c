/*
 * chunk_runtime.c — moving chunks during a step:
 *  - gather: before block b, its streamed chunks are leased from the buffer
 *    pool (a hit when a slot still holds them) or uploaded H2D on the h2d
 *    stream; the next block's chunks are prefetched (one block ahead, both
 *    directions);
 *  - release: after block b the leases drop (the slot keeps its tag, so
 *    backward reuses what forward left); the host's pointers are cleared;
 *  - after a block's backward, each streamed chunk whose gradient is complete
 *    (its lowest block just finished) is copied D2H on the d2h stream and a
 *    CPU task is queued at once: accumulate (n_micro > 1), squared norms
 *    (clipping), and the AdamW step itself when lr is already known and no
 *    clipping is configured — so the CPU optimizer runs while the rest of
 *    backward does instead of after it;
 *  - optimizer_step (optim_step.c) waits for all of it, computes the global norm when
 *    clipping, steps persistent chunks on the device and zeroes their
 *    gradients, and queues the CPU steps that are left (clipping needed the
 *    norm; or lr was not known during backward) in the order the next forward
 *    gathers the chunks, and returns without waiting for them
 *    ([protrain] defer_cpu_steps; false: it waits). A chunk's next upload
 *    waits for its own step on the h2d stream (a host function there waits
 *    for the chunk's task group), so the next forward runs while later chunks
 *    are still being stepped; everything that reads host-side state
 *    (read_param, snapshots, save_state, the next step's gradient copies)
 *    waits for the steps it needs. The math is the same either way. The
 *    caller's chunk_stepped (OSFT's value projection) runs inside each such
 *    step's task, right after the step, so the waits above cover it too.
 * The host computes synchronously on its own thread, so "the compute stream
 * waits for an upload" is an event_sync inside the hook.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_ext.h"
#include "kernels_hd.h"
#include "store_internal.h"


int pt_cs_after_compute(pt_store *st, pt_stream *s, unsigned bit) {
    if (!pt_cs_ord(st, bit)) return PT_OK;
    int rc = OPS(st)->event_record(IMPL(st), st->ev_compute, st->env.s_compute);
    return rc ? rc : OPS(st)->stream_wait_event(IMPL(st), s, st->ev_compute);
}

int pt_cs_compute_waits(pt_store *st, pt_event *e) {
    if (!st->env.ordered) return OPS(st)->event_sync(IMPL(st), e);
    return pt_cs_ord(st, PT_ORD_UPLOAD) ? OPS(st)->stream_wait_event(IMPL(st), st->env.s_compute, e)
                                        : PT_OK;
}

void pt_cs_free(pt_store *st, void *p) {
    if (!pt_cs_ord(st, PT_ORD_FREE)) {
        pt_gpu_free(st->env.gpu, p);
        return;
    }
    /* the bytes are back in the allocator either way; only their queued poison
     * fill can fail, which costs a debugging aid, not correctness: reported */
    char e[256];
    if (pt_gpu_free_on_stream(st->env.gpu, p, st->env.s_compute, e, sizeof e))
        PT_LOGW(st->env.lg, "%s", e);
}

/* The status a chunk's CPU task left (grad_task), once its group was waited
 * for: the worker cannot fail a hook itself, so the hook that waits reports it. */
static int task_status(pt_store *st, cs_chunk *c, const char *hook, char *err, size_t errlen) {
    int rc = c->t_rc;
    c->t_rc = PT_OK;
    if (!rc) return PT_OK;
    char te[512];
    if (c->tiered && pt_tier_failed(st, te, sizeof te))   /* the disk tier's I/O */
        return pt_fail(err, errlen, rc, "%s: chunk %d's optimizer step was not taken: %s", hook,
                       c->id, te);
    return pt_fail(err, errlen, rc,
                   "%s: event_sync on chunk %d's gradient copy to the host failed on the CPU "
                   "optimizer's worker, so its gradient was not used",
                   hook, c->id);
}

int pt_cs_wait_task(pt_store *st, cs_chunk *c, const char *hook, char *err, size_t errlen) {
    pt_pool_wait(st->workers, &c->sg);
    pt_pool_wait(st->workers, &c->tg);
    c->step_pending = 0;
    return task_status(st, c, hook, err, errlen);
}

int pt_cs_init_runtime(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    int rc;
    if (OPS(st)->event_create(IMPL(st), &ms->ev_compute) ||
        OPS(st)->event_create(IMPL(st), &ms->ev_bwd))
        return pt_fail(err, errlen, PT_ERR_BACKEND, "event_create failed: cannot create device events");
    if ((rc = pt_gpu_alloc(st->env.gpu, sizeof(double) * (size_t)ms->n_params, PT_TAG_OTHER,
                           (void **)&ms->norm_dev, err,
                           errlen)))
        return rc;
    if (!ms->n_offloaded) return PT_OK;
    uint64_t S = ms->lay.chunk_size;
    /* a slot holds one chunk's parameters and gradients (2 x chunk_size): when
     * one slot cannot fit on the whole device the setting is the cause, not the
     * device's size. An automatic chunk_size on a device measuring what the
     * setup needs (pt_gpu_measure_begin): the slots land past the capacity and
     * are counted in the size the refusal names */
    pt_gpu_usage u;
    pt_gpu_usage_get(st->env.gpu, &u);
    if (S > u.capacity / 2 && (st->env.cfg->chunk_size || !pt_gpu_measuring(st->env.gpu)))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "[protrain] chunk_size = %llu bytes: an offloaded chunk streams through "
                       "buffer slots of 2 x chunk_size (its parameters and gradients), %llu "
                       "bytes each, more than the device's whole capacity of %llu bytes; lower "
                       "chunk_size (auto sizes it to the model)",
                       (unsigned long long)S,
                       (unsigned long long)(2 * S), (unsigned long long)u.capacity);
    if ((rc = pt_bufpool_create(st->env.gpu, ms->n_buffer, 2 * S, &ms->pool, err, errlen))) return rc;
    ms->buffer_bytes = (uint64_t)ms->n_buffer * 2 * S;
    ms->slot_free = calloc((size_t)ms->n_buffer, sizeof *ms->slot_free);
    ms->slot_used = calloc((size_t)ms->n_buffer, sizeof *ms->slot_used);
    if (!ms->slot_free || !ms->slot_used) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    for (int s = 0; s < ms->n_buffer; s++)
        if (OPS(st)->event_create(IMPL(st), &ms->slot_free[s]) ||
            OPS(st)->event_create(IMPL(st), &ms->slot_used[s]))
            goto ev_fail;
    for (int k = 0; k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        if (c->persistent) continue;
        if (OPS(st)->event_create(IMPL(st), &c->ev_up) ||
            OPS(st)->event_create(IMPL(st), &c->ev_d2h))
            goto ev_fail;
    }
    if ((rc = pt_pool_create(st->env.cfg->cpu_threads, &ms->workers, err, errlen))) return rc;
    PT_LOGI(st->env.lg, "CPU optimizer: %d worker thread(s), %s path", pt_pool_threads(ms->workers),
            pt_cpu_adam_isa());
    return PT_OK;
ev_fail:
    return pt_fail(err, errlen, PT_ERR_BACKEND, "event_create failed: cannot create device events");
}

void pt_cs_fini_runtime(pt_store *st) {
    pt_store *ms = st;
    pt_cs_dist_fini(st);
    if (ms->workers) {
        pt_pool_destroy(ms->workers);
        ms->workers = NULL;
    }
    /* pt_store_destroy, the only caller, has waited for every stream */
    for (int s = 0; s < ms->n_buffer; s++) {
        if (ms->slot_free && ms->slot_free[s]) OPS(st)->event_destroy(IMPL(st), ms->slot_free[s]);
        if (ms->slot_used && ms->slot_used[s]) OPS(st)->event_destroy(IMPL(st), ms->slot_used[s]);
    }
    free(ms->slot_free);
    free(ms->slot_used);
    ms->slot_free = ms->slot_used = NULL;
    if (ms->ev_compute) OPS(st)->event_destroy(IMPL(st), ms->ev_compute);
    ms->ev_compute = NULL;
    if (ms->ev_bwd) OPS(st)->event_destroy(IMPL(st), ms->ev_bwd);
    ms->ev_bwd = NULL;
    for (int k = 0; ms->ch && k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        if (c->ev_up) OPS(st)->event_destroy(IMPL(st), c->ev_up);
        if (c->ev_d2h) OPS(st)->event_destroy(IMPL(st), c->ev_d2h);
        c->ev_up = c->ev_d2h = NULL;
    }
    pt_bufpool_destroy(ms->pool);
    ms->pool = NULL;
    pt_gpu_free(st->env.gpu, ms->norm_dev);
    ms->norm_dev = NULL;
}

/* Point every param stored in chunk c at param_base/grad_base + its offset
 * (NULL bases clear them). Frozen params never get a grad pointer. */
void pt_cs_set_pointers(pt_store *st, cs_chunk *c, void *pbase, void *gbase) {
    pt_store *ms = st;
    pt_model_v1 *m = st->env.model;
    for (int j = 0; j < c->lc->n_params; j++) {
        int root = ms->lay.order[c->lc->first_param + j];
        uint64_t off = ms->lay.param_offset[root];
        void *d = pbase ? (char *)pbase + off : NULL;
        void *g = (gbase && ms->root_tr[root]) ? (char *)gbase + off : NULL;
        m->params[root].data = d;
        m->params[root].grad = g;
    }
    for (int t = 0; t < ms->n_tied; t++) {
        int i = ms->tied[t];
        if (ms->lay.param_chunk[i] != c->id) continue;
        m->params[i].data = m->params[ms->root[i]].data;
        m->params[i].grad = m->params[ms->root[i]].grad;
    }
}

/* On the h2d stream, ahead of chunk c's upload: its deferred CPU step is done
 * (running it here if no worker has started it: the wait runs the group's
 * queued tasks itself). Its own group sg, not tg: an asynchronous host may have
 * queued this step's gradient task into tg already, which waits for a device
 * copy that waits for this very upload. The next step into sg is submitted
 * only after the device finished backward, so this wait sees exactly one. */
static void wait_step(void *arg) {
    cs_chunk *c = arg;
    double t0 = pt_now_s();
    pt_pool_wait(c->owner->workers, &c->sg);
    pt_cs_add_optim_wait(c->owner, pt_now_s() - t0);
}

/* A whole image on the disk tier: held in a staging slot from here until the
 * h2d stream has copied it (the stream waits for its read first); NULL, or
 * the operation that failed. */
static const char *tier_upload(pt_store *st, cs_chunk *c, void *dst) {
    const pt_gpu_backend *o = OPS(st);
    pt_tier_hold_params(st, c);
    pt_tier_slot(st, c);
    const char *op = NULL;
    if (o->host_fn(IMPL(st), st->env.s_h2d, pt_tier_stream_ready, c)) op = "host_fn";
    else if (pt_gpu_memcpy_async(st->env.gpu, dst, c->h_param, (size_t)c->used, PT_GPU_H2D,
                                 st->env.s_h2d))
        op = "memcpy";
    if (op) {
        pt_tier_drop(st, c, PT_TIER_CLEAN);
        return op;
    }
    if (!o->host_fn(IMPL(st), st->env.s_h2d, pt_tier_stream_drop, c)) return NULL;
    (void)o->stream_sync(IMPL(st), st->env.s_h2d);   /* the copy is done: drop it here */
    pt_tier_drop(st, c, PT_TIER_CLEAN);
    return "host_fn";
}

/* Mode C: this rank's part, from its image in a staging slot at level 2 (the
 * upload is done when pt_sh_upload returns: the all-gather waited for it). */
static int tier_sh_upload(pt_store *st, cs_chunk *c, void *dst, char *err, size_t errlen) {
    if (c->tiered != 2) return pt_sh_upload(st, c, dst, err, errlen);
    pt_tier_hold_params(st, c);
    pt_tier_slot(st, c);
    int rc = OPS(st)->host_fn(IMPL(st), st->env.s_h2d, pt_tier_stream_ready, c)
                 ? pt_fail(err, errlen, PT_ERR_BACKEND, "upload of chunk %d: host_fn failed", c->id)
                 : pt_sh_upload(st, c, dst, err, errlen);
    if (rc) (void)OPS(st)->stream_sync(IMPL(st), st->env.s_h2d);   /* nothing reads it after */
    pt_tier_drop(st, c, PT_TIER_CLEAN);
    return rc;
}

/* Upload chunk c into a leased slot (async on the h2d stream). */
static int lease(pt_store *st, cs_chunk *c, char *err, size_t errlen) {
    pt_store *ms = st;
    int32_t slot, hit;
    int rc = pt_bufpool_acquire(ms->pool, c->id, &slot, &hit, err, errlen);
    if (rc) return rc;
    c->slot = slot;
    if (hit) return PT_OK;
    void *dst = pt_bufpool_slot_ptr(ms->pool, slot);
    /* the slot's previous gradient may still be on its way to the host, and the
     * host's kernels may still read its previous chunk */
    const pt_gpu_backend *o = OPS(st);
    const char *op = NULL;
    int src = PT_OK;
    if (o->stream_wait_event(IMPL(st), st->env.s_h2d, ms->slot_free[slot]) ||
        (pt_cs_ord(st, PT_ORD_SLOT) &&
         o->stream_wait_event(IMPL(st), st->env.s_h2d, ms->slot_used[slot])))
        op = "stream_wait_event";
    else if (c->step_pending && !(st->env.skip & PT_ORD_DEFER) &&
             o->host_fn(IMPL(st), st->env.s_h2d, wait_step, c))
        op = "host_fn";
    else if (c->sh) {   /* mode C: this rank's part, then the all-gather */
        if ((src = tier_sh_upload(st, c, dst, err, errlen))) op = "";
    } else if (c->tiered == 2 && (op = tier_upload(st, c, dst)))
        ;
    else if (c->tiered != 2 && pt_gpu_memcpy_async(st->env.gpu, dst, c->h_param, (size_t)c->used,
                                                   PT_GPU_H2D, st->env.s_h2d))
        op = "memcpy";
    else if (o->event_record(IMPL(st), c->ev_up, st->env.s_h2d))
        op = "event_record";
    if (!op) c->step_pending = 0;   /* later uploads of c queue behind this one's wait */
    if (op) {
        /* the slot is tagged with c but never received it: untag it, or the next
         * acquire would report a hit and the host would read stale bytes */
        pt_bufpool_release(ms->pool, slot, NULL, 0);
        pt_bufpool_invalidate(ms->pool, c->id, NULL, 0);
        c->slot = -1;
        if (src) return src;   /* its own sentence is in err */
        return pt_fail(err, errlen, PT_ERR_BACKEND, "upload of chunk %d (%llu bytes) failed: %s failed",
                       c->id, (unsigned long long)c->used, op);
    }
    return PT_OK;
}

/* A full pool only skips the prefetch (the gather of block b uploads then); a
 * backend failure is returned. */
static int prefetch_block(pt_store *st, int b, char *err, size_t errlen) {
    pt_store *ms = st;
    if (b < 0 || b >= st->n_blocks || ms->lay.block_chunk_first[b] < 0) return PT_OK;
    for (int k = ms->lay.block_chunk_first[b]; k <= ms->lay.block_chunk_last[b]; k++) {
        cs_chunk *c = &ms->ch[k];
        if (c->persistent || c->prefetched || c->users) continue;
        char e[512];
        int rc = lease(st, c, e, sizeof e);
        if (rc == PT_ERR_BACKEND) return pt_fail(err, errlen, rc, "prefetch of block %d: %s", b, e);
        if (rc) return PT_OK;
        c->prefetched = 1;
    }
    return PT_OK;
}

int pt_cs_gather(pt_store *st, int32_t b, int backward, char *err, size_t errlen) {
    pt_store *ms = st;
    if (!ms->n_offloaded || ms->lay.block_chunk_first[b] < 0) return PT_OK;
    for (int k = ms->lay.block_chunk_first[b]; k <= ms->lay.block_chunk_last[b]; k++) {
        cs_chunk *c = &ms->ch[k];
        if (c->persistent) continue;
        if (c->prefetched) {
            c->prefetched = 0;          /* the prefetch lease becomes this block's */
        } else if (c->users) {
            int32_t s, hit;             /* still held by another gather: one more lease */
            char why[320] = "not cached in its slot";
            if (pt_bufpool_acquire(ms->pool, c->id, &s, &hit, why, sizeof why) || !hit || s != c->slot) {
                return pt_fail(err, errlen, PT_ERR_INTERNAL, "buffer pool: chunk %d is in use but not resident (%s)",
                               c->id, why);
            }
        } else {
            int rc = lease(st, c, err, errlen);
            if (rc) return rc;
        }
        /* the host's work after this hook reads the upload */
        int rc = pt_cs_compute_waits(st, c->ev_up);
        if (rc) {
            return pt_fail(err, errlen, PT_ERR_BACKEND, "waiting for the upload of chunk %d failed (%s)",
                           c->id, st->env.ordered ? "stream_wait_event" : "event_sync");
        }
        void *base = pt_bufpool_slot_ptr(ms->pool, c->slot);
        void *gbase = (backward && c->trainable) ? (char *)base + ms->lay.chunk_size : NULL;
        if (gbase && !c->bwd_zeroed) {
            /* the slot's last gradient copy to the host is done before the zeroing,
             * which lands before the host's backward accumulates */
            const pt_gpu_backend *o = OPS(st);
            const char *op = NULL;
            int ord = pt_cs_ord(st, PT_ORD_SLOT);
            if (ord ? o->stream_wait_event(IMPL(st), st->env.s_compute, ms->slot_free[c->slot])
                    : o->event_sync(IMPL(st), ms->slot_free[c->slot]))
                op = ord ? "stream_wait_event" : "event_sync";
            else if (o->memset_async(IMPL(st), gbase, 0, (size_t)c->used, ord ? st->env.s_compute : NULL))
                op = "memset";
            if (op) {
                /* the lease taken above stays: the slot holds c's uploaded
                 * params, and destroying the pool frees leased slots too */
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "zeroing chunk %d's gradient before block %d's backward failed: %s "
                               "failed",
                               c->id, b, op);
            }
            c->bwd_zeroed = 1;
        }
        c->users++;
        pt_cs_set_pointers(st, c, base, gbase);
    }
    return prefetch_block(st, backward ? b - 1 : b + 1, err, errlen);
}

/* ---- CPU side of a chunk's gradient ---- */

/* Squared norms per param root, in double, element order (matches a host that
 * sums g^2 param by param). Reads the gradient the optimizer will use. */
void pt_cs_chunk_norms(pt_store *st, cs_chunk *c, int from_acc) {
    pt_store *ms = st;
    if (c->sh) {
        pt_sh_norms(st, c, from_acc);
        return;
    }
    for (int j = 0; j < c->lc->n_params; j++) {
        int root = ms->lay.order[c->lc->first_param + j];
        if (!ms->root_tr[root]) continue;   /* frozen (byte params too): no gradient */
        const pt_param_v1 *p = &st->env.model->params[root];
        uint64_t off = ms->lay.param_offset[root], n = pt_store_param_numel(p);
        double sq = 0;
        if (from_acc) {
            /* the state offset of a param = region state offset + (off - region offset) / es */
            for (int r = 0; r < c->lc->n_regions; r++) {
                const pt_chunk_region *g = &c->lc->regions[r];
                if (off < g->offset || off >= g->offset + g->bytes || c->reg_state[r] == UINT64_MAX)
                    continue;
                const float *x = c->h_gacc + c->reg_state[r] + (off - g->offset) / pt_dtype_size(g->dtype);
                for (uint64_t e = 0; e < n; e++) sq += (double)x[e] * x[e];
            }
        } else {
            const char *x = (const char *)c->h_gstage + off;
            for (uint64_t e = 0; e < n; e++) {
                double v = pt_load_elem(x, p->dtype, (size_t)e);
                sq += v * v;
            }
        }
        ms->psq[root] = sq;
    }
}

int pt_cs_chunk_norms_held(pt_store *st, cs_chunk *c, int from_acc, char *err, size_t errlen) {
    int img = c->tiered == 2, rc = PT_OK;
    if (img) pt_tier_hold(st, c);
    if (img && (rc = pt_tier_ready(st, c)))
        pt_fail(err, errlen, rc, "optimizer_step: the disk tier failed reading chunk %d", c->id);
    else pt_cs_chunk_norms(st, c, from_acc);
    if (img) pt_tier_drop(st, c, PT_TIER_CLEAN);
    return rc;
}

/* acc (+)= stage, region by region, widening to fp32. */
static void chunk_accumulate(cs_chunk *c, int first) {
    if (c->sh) {
        pt_sh_accumulate(c, first);
        return;
    }
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (c->reg_state[r] == UINT64_MAX) continue;
        float *acc = c->h_gacc + c->reg_state[r];
        const char *src = (const char *)c->h_gstage + g->offset;
        uint64_t n = g->bytes / pt_dtype_size(g->dtype);
        if (first) pt_cpu_cvt(acc, PT_F32, src, g->dtype, (size_t)n);
        else
            for (uint64_t e = 0; e < n; e++) acc[e] += pt_load_elem(src, g->dtype, (size_t)e);
    }
}

typedef struct {
    pt_store *st;
    cs_chunk *c;
} chunk_job;

/* Chunk c's CPU step is done (or, as the negative control of PT_ORD_STEPPED,
 * about to start): the caller's chunk_stepped runs now, on this thread, inside
 * the step's task, so whatever waits for the step waits for it too. A mode C
 * chunk holds only this rank's parts: never called for one. */
void pt_cs_stepped(pt_store *st, cs_chunk *c) {
    if (st->env.chunk_stepped && !c->sh) st->env.chunk_stepped(st->env.user, c->id);
}
int pt_cs_stepped_first(const pt_store *st) { return (st->env.skip & PT_ORD_STEPPED) != 0; }

void pt_cs_add_optim_time(pt_store *ms, double dt) {
    pthread_mutex_lock(&ms->acct_mu);
    ms->cpu_optim_s += dt;
    pthread_mutex_unlock(&ms->acct_mu);
}

void pt_cs_add_optim_wait(pt_store *ms, double dt) {
    pthread_mutex_lock(&ms->acct_mu);
    ms->optim_wait_s += dt;
    pthread_mutex_unlock(&ms->acct_mu);
}

static void grad_task(void *arg) {
    chunk_job *j = arg;
    pt_store *st = j->st;
    cs_chunk *c = j->c;
    free(j);
    /* the gradient is on the host; if that cannot be known, nothing reads it
     * and the hook that waits for this task reports the status */
    if (OPS(st)->event_sync(IMPL(st), c->ev_d2h)) {
        c->t_rc = PT_ERR_BACKEND;
        if (c->tiered == 2) pt_tier_drop(st, c, PT_TIER_DISCARD);
        return;
    }
    double t0 = pt_now_s();
    /* a whole image on the tier: held from the gradient copy to here */
    if (c->tiered == 2 && (c->t_rc = pt_tier_ready(st, c))) {
        pt_tier_drop(st, c, PT_TIER_DISCARD);
        return;
    }
    /* the task times are the worker's: a profiling pass's task may still run
     * when the next pre_step comes, so they are reset here, not there */
    if (c->t_micro == 0) c->t_early = 0;
    int acc = c->t_n_micro > 1 || st->env.coll;
    if (acc) chunk_accumulate(c, c->t_micro == 0);
    int last = c->t_micro == c->t_n_micro - 1;
    if (last && c->t_norm) pt_cs_chunk_norms(st, c, acc);
    if (last && c->t_step_now) {
        if (pt_cs_stepped_first(st)) pt_cs_stepped(st, c);
        const pt_optim_cpu a = {&c->t_consts, acc, c->t_lr, 1.0f, c->t_k, NULL, NULL};
        int trc = c->tiered == 1 ? pt_tier_ready(st, c) : PT_OK;   /* its states in a slot */
        if (!trc) st->ok->cpu_step(st, c, &a);   /* the optimizer kind's step, on this worker */
        if (c->tiered == 1) pt_tier_drop(st, c, trc ? PT_TIER_DISCARD : PT_TIER_DIRTY);
        if (trc) c->t_rc = trc;
        if (!pt_cs_stepped_first(st)) pt_cs_stepped(st, c);
    }
    double t1 = pt_now_s();
    if (last) {
        c->t_start = t0;
        c->t_end = t1;
    } else {
        c->t_early += t1 - t0;   /* an earlier micro-batch: done inside the step's backward */
    }
    if (c->tiered == 2) pt_tier_drop(st, c, PT_TIER_DIRTY);   /* its gradient, and its step */
    pt_cs_add_optim_time(st, t1 - t0);
}

/* Runs on the compute stream behind the step's last backward work. */
static void stamp_bwd(void *arg) {
    pt_store *ms = arg;
    double t = pt_now_s();
    pthread_mutex_lock(&ms->acct_mu);
    ms->bwd_done = t;
    pthread_mutex_unlock(&ms->acct_mu);
}

int pt_cs_note_backward_end(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    if (!ms->n_offloaded || st->env.sx->eval || st->env.sx->micro != st->env.sx->n_micro - 1)
        return PT_OK;
    if (!st->env.ordered) {   /* the host computed backward on this thread: done now */
        stamp_bwd(ms);
        return PT_OK;
    }
    const char *op = NULL;
    if (OPS(st)->host_fn(IMPL(st), st->env.s_compute, stamp_bwd, ms)) op = "host_fn";
    else if (OPS(st)->event_record(IMPL(st), ms->ev_bwd, st->env.s_compute)) op = "event_record";
    return op ? pt_fail(err, errlen, PT_ERR_BACKEND,
                        "marking the end of backward on the compute stream failed: %s failed", op)
              : PT_OK;
}

/* The CPU optimizer work of this step that ran before the device finished
 * backward: every earlier micro-batch's task, and of each chunk's last task
 * the part before the end-of-backward stamp. Called after every task is done. */
int pt_cs_account_hidden(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    if (st->env.ordered && OPS(st)->event_sync(IMPL(st), ms->ev_bwd))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: waiting for the end-of-backward mark failed: event_sync failed");
    pthread_mutex_lock(&ms->acct_mu);
    double done = ms->bwd_done, hid = 0;
    for (int k = 0; done > 0 && k < ms->n_chunks; k++) {
        const cs_chunk *c = &ms->ch[k];
        if (c->persistent || !c->trainable) continue;
        hid += c->t_early;
        double end = c->t_end < done ? c->t_end : done;
        if (c->t_end > 0 && end > c->t_start) hid += end - c->t_start;
    }
    ms->cpu_hidden_s += hid;
    pthread_mutex_unlock(&ms->acct_mu);
    return PT_OK;
}

void pt_cs_step_consts(pt_store *st, float lr, float gs, pt_adamw_consts *k) {
    pt_optim_state *o = st->env.opt;
    float bc1, bc2r;
    pt_adamw_bias(o->beta1, o->beta2, o->t + 1, &bc1, &bc2r);
    *k = pt_adamw_make_consts(lr, o->beta1, o->beta2, o->eps, o->weight_decay, bc1, bc2r, gs);
}

static int offload_grad(pt_store *st, cs_chunk *c, char *err, size_t errlen) {
    pt_store *ms = st;
    /* the previous micro-batch's task still reads h_gstage */
    int rc = pt_cs_wait_task(st, c, "block_post_backward", err, errlen);
    if (rc) return rc;
    void *gsrc = (char *)pt_bufpool_slot_ptr(ms->pool, c->slot) + ms->lay.chunk_size;
    /* the gradient is complete once the host's backward of this block has run */
    const pt_gpu_backend *o = OPS(st);
    const char *op = NULL;
    if (c->tiered == 2) {   /* it lands in the chunk's image: in a slot, read first */
        pt_tier_hold(st, c);
        pt_tier_slot(st, c);
        if (o->host_fn(IMPL(st), st->env.s_d2h, pt_tier_stream_ready, c)) {
            pt_tier_drop(st, c, PT_TIER_DISCARD);
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "gradient copy of chunk %d to the host failed: host_fn failed", c->id);
        }
    }
    if (c->sh) {   /* mode C: reduce-scatter, then only this rank's part comes back */
        if ((rc = pt_sh_grad_out(st, c, gsrc, err, errlen))) return rc;
    } else if (pt_cs_ord(st, PT_ORD_GRAD) &&
               o->stream_wait_event(IMPL(st), st->env.s_d2h, ms->slot_used[c->slot]))
        op = "stream_wait_event";
    else if (pt_gpu_memcpy_async(st->env.gpu, c->h_gstage, gsrc, (size_t)c->used, PT_GPU_D2H,
                                 st->env.s_d2h))
        op = "memcpy";
    else if (o->event_record(IMPL(st), c->ev_d2h, st->env.s_d2h) ||
             o->event_record(IMPL(st), ms->slot_free[c->slot], st->env.s_d2h))
        op = "event_record";
    if (op) {
        if (c->tiered == 2) pt_tier_drop(st, c, PT_TIER_DISCARD);
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "gradient copy of chunk %d to the host failed: %s failed", c->id, op);
    }
    int last = st->env.sx->micro == st->env.sx->n_micro - 1;
    c->t_micro = st->env.sx->micro;
    c->t_n_micro = st->env.sx->n_micro;
    /* several ranks: norms and steps wait for the all-reduce in optimizer_step */
    c->t_norm = pt_store_want_norms(st) && !st->env.coll;
    c->t_step_now = last && ms->lr_set && !pt_store_clips(st) && !ms->clip_ann && !st->env.coll;
    if (c->t_step_now) {
        pt_cs_step_consts(st, ms->lr_next, 1.0f, &c->t_consts);
        c->t_lr = ms->lr_next;
        c->t_k = st->env.opt->t + 1;
        c->stepped = 1;
        ms->overlapped = 1;
    }
    chunk_job *j = malloc(sizeof *j);
    if (!j) {
        if (c->tiered == 2) pt_tier_drop(st, c, PT_TIER_DISCARD);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    j->st = st;
    j->c = c;
    /* the chunk's own group: the next micro-batch's copy into h_gstage waits on it,
     * and optimizer_step waits on every chunk's group */
    char why[160];
    /* level 1: its states' read starts now (unless block_pre_backward started
     * it), in the order the tasks are queued */
    int th = c->t_step_now && c->tiered == 1;
    if (th && c->tier_ahead) c->tier_ahead = 0;   /* that hold is this step's */
    else if (th) pt_tier_hold(st, c);
    else if (c->tier_ahead) {   /* the step waits for optimizer_step after all */
        c->tier_ahead = 0;
        pt_tier_drop(st, c, PT_TIER_CLEAN);
    }
    if ((rc = pt_pool_submit(ms->workers, grad_task, j, &c->tg, why, sizeof why))) {
        free(j);
        if (th || c->tiered == 2) pt_tier_drop(st, c, PT_TIER_DISCARD);
        return pt_fail(err, errlen, rc, "cannot queue the CPU optimizer task of chunk %d (%s)", c->id, why);
    }
    return PT_OK;
}

/* Level 1: the condition offload_grad's t_step_now tests, known here already:
 * the step's last micro-batch, lr set, no clipping, one rank. A hold whose
 * step then does not come (a failed hook) keeps its image until the chunk's
 * next step takes it or a view drops it. (Level 2 holds from the gradient
 * copy on: a hold here could fill the slots while the hook thread waits.) */
void pt_cs_tier_ahead(pt_store *st, int32_t b) {
    const pt_step_state *sx = st->env.sx;
    if (pt_tier_level(st) != 1 || sx->eval || sx->micro != sx->n_micro - 1 || !st->lr_set ||
        pt_store_clips(st) || st->clip_ann || st->env.coll || st->lay.block_chunk_first[b] < 0)
        return;
    for (int k = st->lay.block_chunk_first[b]; k <= st->lay.block_chunk_last[b]; k++) {
        cs_chunk *c = &st->ch[k];
        if (c->tiered && c->lc->block_first == b && !c->tier_ahead) {
            c->tier_ahead = 1;
            pt_tier_hold(st, c);
        }
    }
}

int pt_cs_release(pt_store *st, int32_t b, int backward, char *err, size_t errlen) {
    pt_store *ms = st;
    if (!ms->n_offloaded || ms->lay.block_chunk_first[b] < 0) return PT_OK;
    for (int k = ms->lay.block_chunk_first[b]; k <= ms->lay.block_chunk_last[b]; k++) {
        cs_chunk *c = &ms->ch[k];
        if (c->persistent) continue;
        /* the host's work on this slot so far: what a reuse or a copy-out waits for */
        if (st->env.ordered &&
            OPS(st)->event_record(IMPL(st), ms->slot_used[c->slot], st->env.s_compute))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "marking the end of block %d's use of chunk %d's slot failed: "
                           "event_record failed",
                           b, c->id);
        if (backward && c->trainable && c->lc->block_first == b && !st->env.sx->eval) {
            int rc = offload_grad(st, c, err, errlen);
            if (rc) return rc;
        }
        c->users--;
        pt_bufpool_release(ms->pool, c->slot, NULL, 0);
        if (!c->users) {
            pt_cs_set_pointers(st, c, NULL, NULL);
            if (!c->prefetched) c->slot = -1;
        }
    }
    return PT_OK;
}
