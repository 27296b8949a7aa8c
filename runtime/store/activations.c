/*
 * activations.c — per-block activation policy, one mode per block:
 *   NONE  the block's arena stays on the device from its forward to its backward;
 *   CKPT  the arena is freed after block_post_forward(b) (the host keeps the block
 *         input outside it); block_pre_backward(b) allocates a fresh arena and calls
 *         the host's recompute_block(b) before returning;
 *   SWAP  after block_post_forward(b) the arena is copied to a pinned swap buffer on
 *         the d2h stream and freed once the copy's event completes (polled at every
 *         hook, forced when an allocation would fail); in backward it is brought
 *         back on the h2d stream one block ahead and block_pre_backward(b) waits.
 * Arenas are allocated per micro-batch at activation_arena() and freed after the
 * block's backward (or after its forward in an evaluation pass), so the device
 * allocator's peak is the true activation footprint of the chosen mode map.
 *
 * Copy ordering: swap-outs use the d2h stream, which in forward carries nothing
 * else; swap-ins share the h2d stream with chunk prefetch, queued after the
 * chunks of the same block (pre_backward gathers first), so a block never waits
 * for the next block's activations before its own parameters.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"


const char *pt_acts_mode_name(int m) {
    return m == PT_ACT_CKPT ? "CKPT" : m == PT_ACT_SWAP ? "SWAP"
                                                        : "NONE";
}

/* Window w (forward of block w) starts: the swapped arenas the plan released by
 * now leave, waiting for their copies when those run late. */
int pt_acts_pre_forward(pt_store *st, int32_t w, char *err, size_t errlen) {
    for (int j = 0; j < w && j < st->n_blocks; j++) {
        pt_arena *a = &st->arena[j];
        if (!a->swapping_out || a->done_at < 0 || a->done_at >= w) continue;
        /* the copy may still read the arena: it stays until the wait succeeds */
        if (OPS(st)->event_sync(IMPL(st), a->ev_out))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "waiting for block %d's activation swap-out failed: event_sync failed", j);
        pt_cs_free(st, a->ptr);
        a->ptr = NULL;
        a->swapping_out = 0;
    }
    return PT_OK;
}

int pt_acts_init(pt_store *st, const int32_t *modes, const int32_t *swap_done, char *err,
                 size_t errlen) {
    int n = st->n_blocks;
    st->arena = calloc((size_t)(n > 0 ? n : 1), sizeof *st->arena);
    if (!st->arena) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    for (int b = 0; b < n; b++) {
        pt_arena *a = &st->arena[b];
        a->mode = modes ? modes[b] : PT_ACT_NONE;
        /* without a plan: one forward window of overlap for each swap-out, then the
         * arena leaves (waiting for a late copy), so peaks do not depend on timing */
        a->done_at = swap_done ? swap_done[b] : b + 1;
        if (a->mode == PT_ACT_SWAP && (OPS(st)->event_create(IMPL(st), &a->ev_out) ||
                                       OPS(st)->event_create(IMPL(st), &a->ev_in))) {
            return pt_fail(err, errlen, PT_ERR_BACKEND, "event_create failed: cannot create swap events");
        }
    }
    return PT_OK;
}

void pt_acts_fini(pt_store *st) {
    if (!st->arena) return;
    /* pt_store_destroy, the only caller, has waited for every stream */
    for (int b = 0; b < st->n_blocks; b++) {
        pt_arena *a = &st->arena[b];
        if (a->ptr) pt_cs_free(st, a->ptr);
        if (a->host) pt_gpu_pinned_free(st->env.gpu, a->host);
        if (a->ev_out) OPS(st)->event_destroy(IMPL(st), a->ev_out);
        if (a->ev_in) OPS(st)->event_destroy(IMPL(st), a->ev_in);
    }
    free(st->arena);
    st->arena = NULL;
}

/* Free the device copies of swapped-out arenas (wait = 1: all of them, waiting
 * for their copies). wait = 0 frees the finished ones that have no planned
 * release point: with a plan, an arena leaves exactly when the plan said
 * (pt_acts_pre_forward), so the measured peak is the predicted one. */
static int reap(pt_store *st, int wait, char *err, size_t errlen) {
    for (int b = 0; b < st->n_blocks; b++) {
        pt_arena *a = &st->arena[b];
        if (!a->swapping_out) continue;
        if (wait) {
            if (OPS(st)->event_sync(IMPL(st), a->ev_out))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "waiting for block %d's activation swap-out failed: event_sync "
                               "failed",
                               b);
        } else if (a->done_at >= 0 || !OPS(st)->event_query(IMPL(st), a->ev_out)) {
            continue;
        }
        pt_cs_free(st, a->ptr);
        a->ptr = NULL;
        a->swapping_out = 0;
    }
    return PT_OK;
}

/* Device allocation for an arena; a failure first waits for pending swap-outs. */
static int arena_alloc(pt_store *st, pt_arena *a, uint64_t bytes, char *err, size_t errlen) {
    (void)reap(st, 0, NULL, 0);   /* without waiting it calls no failing op */
    int rc = pt_gpu_alloc(st->env.gpu, (size_t)bytes, PT_TAG_ACT, &a->ptr, err, errlen);
    if (rc == PT_ERR_OOM) {
        if ((rc = reap(st, 1, err, errlen))) return rc;
        rc = pt_gpu_alloc(st->env.gpu, (size_t)bytes, PT_TAG_ACT, &a->ptr, err, errlen);
    }
    if (!rc) a->bytes = bytes;
    return rc;
}

int pt_acts_arena(pt_store *st, int32_t b, uint64_t bytes, void **ptr, char *err, size_t errlen) {
    if (!ptr || b < 0 || b >= st->n_blocks || bytes == 0) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "activation_arena: bad arguments (block %d of %d, %llu bytes)", b, st->n_blocks,
                       (unsigned long long)bytes);
    }
    pt_arena *a = &st->arena[b];
    if (a->swapping_out) {
        int rc = reap(st, 1, err, errlen);
        if (rc) return rc;
    }
    if (a->ptr && a->bytes != bytes) {
        pt_cs_free(st, a->ptr);
        a->ptr = NULL;
    }
    if (!a->ptr) {
        int rc = arena_alloc(st, a, bytes, err, errlen);
        if (rc) return rc;
    }
    a->live = 1;
    *ptr = a->ptr;
    return PT_OK;
}

int pt_acts_arena_get(pt_store *st, int32_t b, void **ptr, char *err, size_t errlen) {
    if (!ptr || b < 0 || b >= st->n_blocks) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "activation_arena_get: bad block %d (model has %d)", b, st->n_blocks);
    }
    pt_arena *a = &st->arena[b];
    if (!a->ptr || a->swapping_out) {
        return pt_fail(err, errlen, PT_ERR_ORDER, "activation_arena_get: block %d has no arena on the device now (mode %s; its "
                                                  "activations are restored in block_pre_backward(%d))",
                       b, pt_acts_mode_name(a->mode), b);
    }
    *ptr = a->ptr;
    return PT_OK;
}

int pt_acts_post_forward(pt_store *st, int32_t b, char *err, size_t errlen) {
    pt_arena *a = &st->arena[b];
    (void)reap(st, 0, NULL, 0);   /* without waiting it calls no failing op */
    if (!a->ptr) return PT_OK;                    /* the block saved nothing */
    if (st->env.sx->eval || a->mode == PT_ACT_CKPT) {
        int m = !st->env.sx->eval && st->env.mark;
        if (m) st->env.mark(st->env.user, PT_STORE_MARK_ARENA_FREE_FWD, b, 0);
        pt_cs_free(st, a->ptr);             /* poisoned: stale pointers read NaN */
        if (m) st->env.mark(st->env.user, PT_STORE_MARK_ARENA_FREE_FWD, b, 1);
        a->ptr = NULL;
        return PT_OK;
    }
    if (a->mode != PT_ACT_SWAP) return PT_OK;
    if (a->host && a->host_bytes < a->bytes) {
        pt_gpu_pinned_free(st->env.gpu, a->host);
        a->host = NULL;
    }
    if (!a->host) {
        int rc = pt_gpu_pinned_alloc(st->env.gpu, (size_t)a->bytes, &a->host, err, errlen);
        if (rc) return rc;
        a->host_bytes = a->bytes;
    }
    /* the copy reads what the host's forward of b writes */
    const char *op = pt_cs_after_compute(st, st->env.s_d2h, PT_ORD_SWAP)
                         ? "event_record or stream_wait_event"
                     : pt_gpu_memcpy_async(st->env.gpu, a->host, a->ptr, (size_t)a->bytes,
                                           PT_GPU_D2H, st->env.s_d2h)
                         ? "memcpy"
                     : OPS(st)->event_record(IMPL(st), a->ev_out, st->env.s_d2h) ? "event_record"
                                                                                 : NULL;
    if (op) {
        return pt_fail(err, errlen, PT_ERR_BACKEND, "swap-out of block %d's activations failed: %s failed", b, op);
    }
    a->swapping_out = 1;
    st->swap_out_bytes += a->bytes;
    return PT_OK;
}

/* Start bringing block b's swapped activations back (async on the h2d stream). */
static int swap_in_start(pt_store *st, int32_t b, char *err, size_t errlen) {
    pt_arena *a = &st->arena[b];
    if (a->mode != PT_ACT_SWAP || a->swapping_in || !a->host || !a->live) return PT_OK;
    if (a->swapping_out) {
        if (OPS(st)->event_sync(IMPL(st), a->ev_out))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "waiting for block %d's activation swap-out failed: event_sync failed", b);
        pt_cs_free(st, a->ptr);
        a->ptr = NULL;
        a->swapping_out = 0;
    }
    if (a->ptr) return PT_OK;
    int rc = arena_alloc(st, a, a->host_bytes < a->bytes ? a->host_bytes : a->bytes, err, errlen);
    if (rc) return rc;
    /* the new arena's bytes may have been freed in the compute stream's order */
    const char *op = pt_cs_after_compute(st, st->env.s_h2d, PT_ORD_SWAP)
                         ? "event_record or stream_wait_event"
                     : pt_gpu_memcpy_async(st->env.gpu, a->ptr, a->host, (size_t)a->bytes,
                                           PT_GPU_H2D, st->env.s_h2d)
                         ? "memcpy"
                     : OPS(st)->event_record(IMPL(st), a->ev_in, st->env.s_h2d) ? "event_record"
                                                                                : NULL;
    if (op) {
        /* without the copy the fresh arena holds garbage: drop it, so a retry
         * allocates and copies again instead of finding it "already back" */
        pt_cs_free(st, a->ptr);
        a->ptr = NULL;
        return pt_fail(err, errlen, PT_ERR_BACKEND, "swap-in of block %d's activations failed: %s failed", b, op);
    }
    a->swapping_in = 1;
    return PT_OK;
}

int pt_acts_pre_backward(pt_store *st, int32_t b, char *err, size_t errlen) {
    pt_arena *a = &st->arena[b];
    /* the turn: every swap-out is over by the first backward window */
    int rc = reap(st, b == st->n_blocks - 1, err, errlen);
    if (rc) return rc;
    if (a->mode == PT_ACT_SWAP && a->live) {
        if ((rc = swap_in_start(st, b, err, errlen))) return rc;
        /* the host's backward of b reads the swapped-in arena */
        if (pt_cs_compute_waits(st, a->ev_in))
            return pt_fail(err, errlen, PT_ERR_BACKEND, "waiting for block %d's swap-in failed: %s failed", b,
                           st->env.ordered ? "stream_wait_event" : "event_sync");
        a->swapping_in = 0;
    }
    /* prefetch the next backward block's swapped activations, before this
     * block's recompute (below): the copy then overlaps the recompute and the
     * backward. Started after it, it overlapped the backward alone, and a SWAP
     * block under a CKPT one waited out the rest (an op trace: 2.7 ms exposed
     * of a 5.6 ms swap-in behind a 1.8 ms recompute and a 2.9 ms backward). */
    if (b > 0) {
        /* a prefetch short of memory is retried by block b-1's own hook; a
         * failed device op is an error now */
        char e2[256];
        int prc = swap_in_start(st, b - 1, e2, sizeof e2);
        if (prc == PT_ERR_BACKEND) return pt_fail(err, errlen, prc, "swap-in prefetch: %s", e2);
        if (prc) PT_LOGD(st->env.lg, "swap-in prefetch: %s", e2);
    }
    if (a->mode == PT_ACT_CKPT && a->live) {
        if ((rc = arena_alloc(st, a, a->bytes, err, errlen))) return rc;
        if (!st->env.host->recompute_block) {
            return pt_fail(err, errlen, PT_ERR_CALLBACK, "block %d is CKPT but the host gave no recompute_block callback", b);
        }
        if (st->env.mark) st->env.mark(st->env.user, PT_STORE_MARK_RECOMPUTE, b, 0);
        int hrc = st->env.host->recompute_block(st->env.host->user, b);
        if (st->env.mark) st->env.mark(st->env.user, PT_STORE_MARK_RECOMPUTE, b, 1);
        if (hrc) {
            return pt_fail(err, errlen, PT_ERR_CALLBACK, "host recompute_block(%d) returned %d", b, hrc);
        }
        st->recomputes++;
    }
    return PT_OK;
}

int pt_acts_post_backward(pt_store *st, int32_t b) {
    pt_arena *a = &st->arena[b];
    if (a->ptr && !a->swapping_out) {
        if (st->env.mark) st->env.mark(st->env.user, PT_STORE_MARK_ARENA_FREE, b, 0);
        pt_cs_free(st, a->ptr);
        if (st->env.mark) st->env.mark(st->env.user, PT_STORE_MARK_ARENA_FREE, b, 1);
        a->ptr = NULL;
    }
    a->live = 0;
    (void)reap(st, 0, NULL, 0);   /* without waiting it calls no failing op */
    return PT_OK;
}
