/*
 * hooks.c — the store's side of each block hook: chunks and activations in the
 * order the host's next computation needs them, the arena queries the
 * runtime's host services make, pre_step's set-up of a step and the wait for
 * every stream of the store.
 */
#include "store_internal.h"

/* Forward of b: swapped arenas whose plan window ended leave first (their
 * bytes are free before b's chunks arrive), then b's chunks are gathered. */
int pt_store_pre_forward(pt_store *st, int32_t b, char *err, size_t errlen) {
    int rc = pt_acts_pre_forward(st, b, err, errlen);
    return rc ? rc : pt_cs_gather(st, b, 0, err, errlen);
}

int pt_store_post_forward(pt_store *st, int32_t b, char *err, size_t errlen) {
    int rc = pt_cs_release(st, b, 0, err, errlen);
    return rc ? rc : pt_acts_post_forward(st, b, err, errlen);
}

/* Parameters first, then activations: a CKPT recompute reads the block's params. */
int pt_store_pre_backward(pt_store *st, int32_t b, char *err, size_t errlen) {
    int rc = pt_cs_dist_poll(st, err, errlen);   /* gradient buckets whose backward ended */
    if (!rc) rc = pt_cs_gather(st, b, 1, err, errlen);
    if (!rc) pt_cs_tier_ahead(st, b);   /* the disk tier's reads of this block's steps */
    return rc ? rc : pt_acts_pre_backward(st, b, err, errlen);
}

int pt_store_post_backward(pt_store *st, int32_t b, char *err, size_t errlen) {
    int rc = pt_cs_release(st, b, 1, err, errlen);
    if (!rc) rc = pt_acts_post_backward(st, b);
    /* several ranks: resident chunks this block's backward completed start
     * their all-reduce once the device is done with them */
    if (!rc) rc = pt_cs_dist_bucket(st, b, err, errlen);
    /* backward runs from the last block down: block 0 ends it */
    return (rc || b != 0) ? rc : pt_cs_note_backward_end(st, err, errlen);
}

int pt_store_is_arena(const pt_store *st, const void *ptr) {
    for (int b = 0; st && st->arena && ptr && b < st->n_blocks; b++)
        if (st->arena[b].ptr == ptr) return b;
    return -1;
}

uint64_t pt_store_arena_bytes(const pt_store *st, int32_t b) {
    if (!st || !st->arena || b < 0 || b >= st->n_blocks || !st->arena[b].ptr) return 0;
    return pt_gpu_round_size(st->arena[b].bytes);
}

/* Deferred CPU steps first, then the three streams. */
int pt_store_sync(pt_store *st, char *err, size_t errlen) {
    if (!st) return PT_OK;
    const pt_gpu_backend *o = OPS(st);
    /* every stream is waited for even after one fails: destructors free what
     * the others may still be using */
    /* deferred CPU steps first: an upload on the h2d stream may be waiting for one */
    for (int k = 0; k < st->n_chunks; k++)
        if (!st->ch[k].persistent) {
            pt_pool_wait(st->workers, &st->ch[k].sg);
            pt_pool_wait(st->workers, &st->ch[k].tg);
        }
    /* and the disk tier's write-backs of those steps */
    char te[512];
    int trc = pt_tier_sync(st, te, sizeof te);
    pt_stream *s[3] = {st->env.s_compute, st->env.s_h2d, st->env.s_d2h};
    static const char *const name[3] = {"compute", "h2d", "d2h"};
    int bad = -1;
    for (int i = 0; i < 3; i++)
        if (o->stream_sync(IMPL(st), s[i]) && bad < 0) bad = i;
    if (bad >= 0)
        return pt_fail(err, errlen, PT_ERR_BACKEND, "stream_sync of the %s stream failed",
                       name[bad]);
    if (trc) return pt_fail(err, errlen, trc, "%s", te);
    return PT_OK;
}

/* A step's start: per-step flags reset, and on first need the pinned fp32
 * gradient sums of offloaded chunks. */
int pt_store_pre_step(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    if (st->env.sx->eval) return PT_OK;
    if (!st->opt_ready && !st->profiling) {
        return pt_fail(err, errlen, PT_ERR_ORDER, "pre_step: no optimizer (call create_optimizer first)");
    }
    for (int k = 0; k < ms->n_chunks; k++) ms->ch[k].bwd_zeroed = 0;
    if (st->env.sx->micro == 0 && ms->bq_n) {
        /* the last step's backward queued gradient buckets and no optimizer_step
         * took them: dropped (their messages unmatched, so the group stops) */
        PT_LOGW(st->env.lg, "pre_step: the previous step's backward was not followed by "
                            "optimizer_step; its gradient all-reduces are abandoned");
        pt_cs_dist_fini(st);
    }
    if (st->env.sx->micro == 0) {
        pthread_mutex_lock(&ms->acct_mu);
        ms->bwd_done = 0;
        pthread_mutex_unlock(&ms->acct_mu);
    }
    if ((st->env.sx->n_micro > 1 || st->env.coll) && !ms->gacc_ready) {
        /* accumulated fp32 gradients of offloaded chunks, allocated on first need;
         * with several ranks always: the all-reduce sums them in fp32 whatever the
         * chunk's dtype (a 16-bit sum would round at every rank) */
        uint64_t more = 0;
        for (int k = 0; k < ms->n_chunks; k++)
            if (!ms->ch[k].persistent && ms->ch[k].trainable && ms->ch[k].tiered != 2)
                more += 4 * ms->ch[k].n_state;
        /* automatic staging slots beyond 3 give their memory back where the sums
         * would not fit beside them */
        int rc = pt_tier_make_room(st, more, err, errlen);
        if (rc) return rc;
        for (int k = 0; k < ms->n_chunks; k++) {
            cs_chunk *c = &ms->ch[k];
            if (c->persistent || !c->trainable || c->tiered == 2) continue;   /* level 2: in
                                                                                 * its record */
            rc = pt_gpu_pinned_alloc(st->env.gpu, (size_t)c->n_state * 4, (void **)&c->h_gacc,
                                     err, errlen);
            if (rc) return rc;
        }
        ms->pinned_bytes += more;
        ms->gacc_ready = 1;
        PT_LOGI(st->env.lg, "gradient accumulation over %d micro-batches: %.2f MiB more pinned "
                            "memory for fp32 gradient sums",
                st->env.sx->n_micro, more / 1048576.0);
    }
    return PT_OK;
}
