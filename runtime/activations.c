/*
 * activations.c — per-block activation policy (PROTRAIN.md section 4):
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

#include <time.h>

#include "profiler.h"
#include "rt_internal.h"

#define ERR(...) (snprintf(err, errlen, __VA_ARGS__))

static const pt_gpu_backend *OPS(pt_rt *rt) { return pt_gpu_ops(rt->gpu); }
static void *IMPL(pt_rt *rt) { return pt_gpu_impl(rt->gpu); }

const char *pt_acts_mode_name(int m) {
    return m == PT_ACT_CKPT ? "CKPT" : m == PT_ACT_SWAP ? "SWAP" : "NONE";
}

/* Window w (forward of block w) starts: the swapped arenas the plan released by
 * now leave, waiting for their copies when those run late. */
void pt_acts_pre_forward(pt_rt *rt, int32_t w) {
    for (int j = 0; j < w && j < rt->n_blocks; j++) {
        pt_arena *a = &rt->arena[j];
        if (!a->swapping_out || a->done_at < 0 || a->done_at >= w) continue;
        OPS(rt)->event_sync(IMPL(rt), a->ev_out);
        pt_gpu_free(rt->gpu, a->ptr);
        a->ptr = NULL;
        a->swapping_out = 0;
    }
}

int pt_acts_init(pt_rt *rt, const int32_t *modes, char *err, size_t errlen) {
    int n = rt->n_blocks;
    rt->arena = calloc((size_t)(n > 0 ? n : 1), sizeof *rt->arena);
    if (!rt->arena) {
        ERR("out of host memory");
        return PT_ERR_HOST_OOM;
    }
    for (int b = 0; b < n; b++) {
        pt_arena *a = &rt->arena[b];
        a->mode = modes ? modes[b] : PT_ACT_NONE;
        /* without a plan: one forward window of overlap for each swap-out, then the
         * arena leaves (waiting for a late copy), so peaks do not depend on timing */
        a->done_at = rt->swap_done ? rt->swap_done[b] : b + 1;
        if (a->mode == PT_ACT_SWAP && (OPS(rt)->event_create(IMPL(rt), &a->ev_out) ||
                                       OPS(rt)->event_create(IMPL(rt), &a->ev_in))) {
            ERR("cannot create swap events");
            return PT_ERR_BACKEND;
        }
    }
    return PT_OK;
}

void pt_acts_fini(pt_rt *rt) {
    if (!rt->arena) return;
    if (rt->s_d2h) OPS(rt)->stream_sync(IMPL(rt), rt->s_d2h);
    if (rt->s_h2d) OPS(rt)->stream_sync(IMPL(rt), rt->s_h2d);
    for (int b = 0; b < rt->n_blocks; b++) {
        pt_arena *a = &rt->arena[b];
        if (a->ptr) pt_gpu_free(rt->gpu, a->ptr);
        if (a->host) pt_gpu_pinned_free(rt->gpu, a->host);
        if (a->ev_out) OPS(rt)->event_destroy(IMPL(rt), a->ev_out);
        if (a->ev_in) OPS(rt)->event_destroy(IMPL(rt), a->ev_in);
    }
    free(rt->arena);
    rt->arena = NULL;
}

/* Free the device copies of swapped-out arenas (wait = 1: all of them, waiting
 * for their copies). wait = 0 frees the finished ones that have no planned
 * release point: with a plan, an arena leaves exactly when the plan said
 * (pt_acts_pre_forward), so the measured peak is the predicted one. */
void pt_acts_reap(pt_rt *rt, int wait) {
    for (int b = 0; b < rt->n_blocks; b++) {
        pt_arena *a = &rt->arena[b];
        if (!a->swapping_out) continue;
        if (wait) OPS(rt)->event_sync(IMPL(rt), a->ev_out);
        else if (a->done_at >= 0 || !OPS(rt)->event_query(IMPL(rt), a->ev_out)) continue;
        pt_gpu_free(rt->gpu, a->ptr);
        a->ptr = NULL;
        a->swapping_out = 0;
    }
}

/* Device allocation for an arena; a failure first waits for pending swap-outs. */
static int arena_alloc(pt_rt *rt, pt_arena *a, uint64_t bytes, char *err, size_t errlen) {
    pt_acts_reap(rt, 0);
    int rc = pt_gpu_alloc(rt->gpu, (size_t)bytes, PT_TAG_ACT, &a->ptr, err, errlen);
    if (rc == PT_ERR_OOM) {
        pt_acts_reap(rt, 1);
        rc = pt_gpu_alloc(rt->gpu, (size_t)bytes, PT_TAG_ACT, &a->ptr, err, errlen);
    }
    if (!rc) a->bytes = bytes;
    return rc;
}

int pt_rt_arena(pt_rt *rt, int32_t b, uint64_t bytes, void **ptr, char *err, size_t errlen) {
    if (!ptr || b < 0 || b >= rt->n_blocks || bytes == 0) {
        ERR("activation_arena: bad arguments (block %d of %d, %llu bytes)", b, rt->n_blocks,
            (unsigned long long)bytes);
        return PT_ERR_INVALID_ARG;
    }
    pt_arena *a = &rt->arena[b];
    if (a->swapping_out) pt_acts_reap(rt, 1);
    if (a->ptr && a->bytes != bytes) {
        pt_gpu_free(rt->gpu, a->ptr);
        a->ptr = NULL;
    }
    if (!a->ptr) {
        int rc = arena_alloc(rt, a, bytes, err, errlen);
        if (rc) return rc;
    }
    a->live = 1;
    *ptr = a->ptr;
    return PT_OK;
}

int pt_rt_arena_get(pt_rt *rt, int32_t b, void **ptr, char *err, size_t errlen) {
    if (!ptr || b < 0 || b >= rt->n_blocks) {
        ERR("activation_arena_get: bad block %d (model has %d)", b, rt->n_blocks);
        return PT_ERR_INVALID_ARG;
    }
    pt_arena *a = &rt->arena[b];
    if (!a->ptr || a->swapping_out) {
        ERR("activation_arena_get: block %d has no arena on the device now (mode %s; its "
            "activations are restored in block_pre_backward(%d))", b, pt_acts_mode_name(a->mode), b);
        return PT_ERR_ORDER;
    }
    *ptr = a->ptr;
    return PT_OK;
}

int pt_acts_post_forward(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    pt_arena *a = &rt->arena[b];
    pt_acts_reap(rt, 0);
    if (!a->ptr) return PT_OK;                    /* the block saved nothing */
    if (rt->eval || a->mode == PT_ACT_CKPT) {
        pt_gpu_free(rt->gpu, a->ptr);             /* poisoned: stale pointers read NaN */
        a->ptr = NULL;
        return PT_OK;
    }
    if (a->mode != PT_ACT_SWAP) return PT_OK;
    if (a->host && a->host_bytes < a->bytes) {
        pt_gpu_pinned_free(rt->gpu, a->host);
        a->host = NULL;
    }
    if (!a->host) {
        int rc = pt_gpu_pinned_alloc(rt->gpu, (size_t)a->bytes, &a->host, err, errlen);
        if (rc) return rc;
        a->host_bytes = a->bytes;
    }
    int rc = pt_gpu_memcpy_async(rt->gpu, a->host, a->ptr, (size_t)a->bytes, PT_GPU_D2H, rt->s_d2h);
    if (!rc) rc = OPS(rt)->event_record(IMPL(rt), a->ev_out, rt->s_d2h);
    if (rc) {
        ERR("swap-out of block %d's activations failed", b);
        return PT_ERR_BACKEND;
    }
    a->swapping_out = 1;
    rt->swap_out_bytes += a->bytes;
    return PT_OK;
}

/* Start bringing block b's swapped activations back (async on the h2d stream). */
static int swap_in_start(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    pt_arena *a = &rt->arena[b];
    if (a->mode != PT_ACT_SWAP || a->swapping_in || !a->host || !a->live) return PT_OK;
    if (a->swapping_out) {
        OPS(rt)->event_sync(IMPL(rt), a->ev_out);
        pt_gpu_free(rt->gpu, a->ptr);
        a->ptr = NULL;
        a->swapping_out = 0;
    }
    if (a->ptr) return PT_OK;
    int rc = arena_alloc(rt, a, a->host_bytes < a->bytes ? a->host_bytes : a->bytes, err, errlen);
    if (rc) return rc;
    rc = pt_gpu_memcpy_async(rt->gpu, a->ptr, a->host, (size_t)a->bytes, PT_GPU_H2D, rt->s_h2d);
    if (!rc) rc = OPS(rt)->event_record(IMPL(rt), a->ev_in, rt->s_h2d);
    if (rc) {
        ERR("swap-in of block %d's activations failed", b);
        return PT_ERR_BACKEND;
    }
    a->swapping_in = 1;
    return PT_OK;
}

int pt_acts_pre_backward(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    pt_arena *a = &rt->arena[b];
    /* the turn: every swap-out is over by the first backward window */
    pt_acts_reap(rt, b == rt->n_blocks - 1);
    int rc = PT_OK;
    if (a->mode == PT_ACT_SWAP && a->live) {
        if ((rc = swap_in_start(rt, b, err, errlen))) return rc;
        OPS(rt)->event_sync(IMPL(rt), a->ev_in);
        a->swapping_in = 0;
    } else if (a->mode == PT_ACT_CKPT && a->live) {
        if ((rc = arena_alloc(rt, a, a->bytes, err, errlen))) return rc;
        if (!rt->host.recompute_block) {
            ERR("block %d is CKPT but the host gave no recompute_block callback", b);
            return PT_ERR_CALLBACK;
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int hrc = rt->host.recompute_block(rt->host.user, b);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (rt->prof)
            pt_prof_recompute(rt, b, (double)(t1.tv_sec - t0.tv_sec) +
                                         1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        if (hrc) {
            ERR("host recompute_block(%d) returned %d", b, hrc);
            return PT_ERR_CALLBACK;
        }
        rt->recomputes++;
    }
    /* prefetch the next backward block's swapped activations */
    if (b > 0) {
        char e2[256];
        if (swap_in_start(rt, b - 1, e2, sizeof e2)) PT_LOGD(&rt->lg, "swap-in prefetch: %s", e2);
    }
    return PT_OK;
}

int pt_acts_post_backward(pt_rt *rt, int32_t b) {
    pt_arena *a = &rt->arena[b];
    if (a->ptr && !a->swapping_out) {
        pt_gpu_free(rt->gpu, a->ptr);
        a->ptr = NULL;
    }
    a->live = 0;
    pt_acts_reap(rt, 0);
    return PT_OK;
}
