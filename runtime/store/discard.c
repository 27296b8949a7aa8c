/*
 * discard.c — dropping the step in progress (protrain.h: discard_step): the
 * store goes back to what it held after the last optimizer_step.
 *
 * What a step changes before its optimizer_step, and how each is undone:
 *  - resident chunks' gradients (d_grad, accumulated over the micro-batches):
 *    zeroed, as optimizer_step would have left them;
 *  - offloaded chunks' gradients: the slot's gradient half is zeroed again by
 *    the next backward's gather (bwd_zeroed is per micro-batch), h_gstage is
 *    overwritten by the next copy, and the fp32 sum h_gacc is written (not
 *    added) by micro-batch 0's task: nothing to undo once their CPU tasks are
 *    waited for;
 *  - leases of buffer-pool slots held by the open block window and by
 *    prefetches: dropped (a slot keeps its tag, so the next gather of the same
 *    chunk still hits: its parameters did not change);
 *  - activation arenas: freed, swap copies waited for;
 *  - set_lr's lr for the coming step and the host's clipping of it (announced
 *    or computed by clip_grad_norm): forgotten (the host gives them again).
 * What cannot be undone: an offloaded chunk the CPU optimizer already stepped
 * during this step's backward (set_lr told the lr early, overlap): its master
 * weights and moments moved. Then the discard is refused before anything
 * changes, naming how many chunks were stepped.
 */
#include "store_internal.h"

/* Chunks whose CPU step of this step was already queued during backward. */
static int stepped_chunks(const pt_store *st) {
    int n = 0;
    for (int k = 0; k < st->n_chunks; k++) n += !st->ch[k].persistent && st->ch[k].stepped;
    return n;
}

static void drop_leases(pt_store *st) {
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        if (c->persistent) continue;
        int leases = c->users + (c->prefetched ? 1 : 0);
        for (int i = 0; i < leases && c->slot >= 0; i++)
            (void)pt_bufpool_release(st->pool, c->slot, NULL, 0);
        if (c->users) pt_cs_set_pointers(st, c, NULL, NULL);
        c->users = 0;
        c->prefetched = 0;
        c->slot = -1;
        c->bwd_zeroed = 0;
        c->t_rc = PT_OK;   /* a failed gradient copy belonged to the dropped step */
    }
}

static void drop_arenas(pt_store *st) {
    for (int b = 0; b < st->n_blocks; b++) {
        pt_arena *a = &st->arena[b];
        if (a->ptr) pt_cs_free(st, a->ptr);
        a->ptr = NULL;
        a->live = 0;
        a->swapping_out = a->swapping_in = 0;
    }
}

static int zero_resident_grads(pt_store *st, char *err, size_t errlen) {
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        if (!c->persistent || !c->trainable || !c->d_grad) continue;
        if (OPS(st)->memset_async(IMPL(st), c->d_grad, 0, (size_t)c->used, st->env.s_compute))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "discard_step: zeroing chunk %d's device gradient failed: memset "
                           "failed", c->id);
    }
    if (OPS(st)->stream_sync(IMPL(st), st->env.s_compute))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "discard_step: stream_sync of the compute stream failed");
    return PT_OK;
}

int pt_store_discard(pt_store *st, int eval, char *err, size_t errlen) {
    int n = eval ? 0 : stepped_chunks(st);
    if (n)
        return pt_fail(err, errlen, PT_ERR_ORDER,
                       "discard_step: the CPU optimizer already stepped %d offloaded chunk(s) of "
                       "this step during its backward (set_lr gave the lr early, so steps "
                       "overlap backward), which changed their weights and moments; the step "
                       "cannot be undone: finish it (backward and optimizer_step) or load a "
                       "saved state", n);
    /* every CPU task and queued copy is over before their memory is reused */
    int rc = pt_store_sync(st, err, errlen);
    if (rc) return rc;
    drop_leases(st);
    drop_arenas(st);
    if (!eval && (rc = zero_resident_grads(st, err, errlen))) return rc;
    if (!eval) {
        st->lr_set = 0;
        st->overlapped = 0;
        /* the host's clipping of this step (announced, or its norm taken) */
        st->want_norm = st->clip_ann = st->reduced = st->normed = 0;
        st->clip_step = 0;
        pthread_mutex_lock(&st->acct_mu);
        st->bwd_done = 0;
        pthread_mutex_unlock(&st->acct_mu);
    }
    return PT_OK;
}
