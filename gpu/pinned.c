/*
 * pinned.c — pinned host memory of the device wrapper: the budget, and an
 * optional arena.
 *
 * Why an arena: on cuda every pinned allocation is a cudaHostAlloc (slow, and
 * taken under the wrapper's lock) and every free a cudaFreeHost, which waits for
 * the whole device. A caller that knows its total (the store, once the plan
 * says which chunks are offloaded) reserves it once with pt_gpu_pinned_reserve;
 * later pinned allocations are carved from it by the extent allocator (best
 * fit, PT_GPU_ALIGN-byte blocks) and frees only return blocks to it, so no
 * free during training touches the driver. An allocation the arena cannot hold
 * gets its own host_alloc and is counted (usage.pinned_own_allocs),
 * so a test can assert the reservation was large enough.
 *
 * The budget (usage.pinned_budget) counts requested bytes of live allocations,
 * inside the arena or not; the arena itself must fit in the budget.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "device_internal.h"
#include "pt_util.h"
#include "protrain.h"

/* Budget check for `bytes` more (caller holds mu). */
static int over_budget(const pt_gpu *g, size_t bytes) {
    uint64_t cur = g->u.pinned_current, budget = g->u.pinned_budget;
    return budget && (bytes > budget || cur > budget - bytes);
}

static void charge(pt_gpu *g, size_t bytes) {
    g->u.pinned_current += bytes;
    if (g->u.pinned_current > g->u.pinned_peak) g->u.pinned_peak = g->u.pinned_current;
}

int pt_gpu_pinned_alloc(pt_gpu *g, size_t bytes, void **p, char *err, size_t errlen) {
    if (!g || !p)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_pinned_alloc: %s",
                       !g ? "device is NULL" : "output pointer is NULL");
    *p = NULL;
    pthread_mutex_lock(&g->mu);
    if (over_budget(g, bytes)) {
        uint64_t cur = g->u.pinned_current, budget = g->u.pinned_budget;
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pinned host memory budget exceeded: needs %zu bytes, %" PRIu64
                       " in use of a %" PRIu64 "-byte budget",
                       bytes, cur, budget);
    }
    if (g->pin_base) {
        uint64_t size = pt_gpu_round_size(bytes);
        pt_blk *x = size ? pt_ext_carve(&g->pin, size) : NULL;
        if (x && pt_ptrmap_put(&g->pin_live, (uintptr_t)(g->pin_base + x->off),
                               (uint64_t)(uintptr_t)x) != 0) {
            pt_ext_release(&g->pin, x);
            x = NULL;
        }
        if (x) {
            x->req = bytes;
            charge(g, bytes);
            *p = g->pin_base + x->off;
            pthread_mutex_unlock(&g->mu);
            return PT_OK;
        }
    }
    /* Under the lock so the budget check and the charge are one step; pinned
     * allocations outside an arena are few and large. */
    void *q = NULL;
    if (g->ops->host_alloc(g->impl, bytes, &q) != PT_OK || !q) {
        uint64_t cur = g->u.pinned_current;
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pinned host allocation of %zu bytes failed on the %s backend (%" PRIu64
                       " bytes pinned so far)",
                       bytes, g->ops->name, cur);
    }
    if (pt_ptrmap_put(&g->pinned, (uintptr_t)q, bytes) != 0) {
        g->ops->host_free(g->impl, q, bytes);
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pt_gpu_pinned_alloc: out of host memory for the allocation table");
    }
    charge(g, bytes);
    g->u.pinned_own_allocs++;
    pthread_mutex_unlock(&g->mu);
    *p = q;
    return PT_OK;
}

void pt_gpu_pinned_free(pt_gpu *g, void *p) {
    if (!g || !p) return;
    uint64_t v;
    pthread_mutex_lock(&g->mu);
    if (pt_ptrmap_get(&g->pin_live, (uintptr_t)p, &v)) {
        pt_blk *x = (pt_blk *)(uintptr_t)v;
        pt_ptrmap_del(&g->pin_live, (uintptr_t)p);
        g->u.pinned_current -= x->req;
        pt_ext_release(&g->pin, x);   /* no driver call: the bytes stay pinned */
    } else if (pt_ptrmap_get(&g->pinned, (uintptr_t)p, &v)) {
        pt_ptrmap_del(&g->pinned, (uintptr_t)p);
        g->u.pinned_current -= v;
        g->ops->host_free(g->impl, p, (size_t)v);
    }
    pthread_mutex_unlock(&g->mu);
}

size_t pt_gpu_live_pinned(const pt_gpu *g) {
    if (!g) return 0;
    pthread_mutex_lock(pt_gpu_mu(g));
    size_t n = g->pinned.n + g->pin_live.n;
    pthread_mutex_unlock(pt_gpu_mu(g));
    return n;
}

/* Frees the arena (caller holds mu; nothing live in it). */
static void drop_arena(pt_gpu *g) {
    if (!g->pin_base) return;
    g->ops->host_free(g->impl, g->pin_base, (size_t)g->pin_size);
    pt_ext_destroy(&g->pin);
    pt_ptrmap_free(&g->pin_live);
    g->pin_base = NULL;
    g->pin_size = 0;
    g->u.pinned_arena = 0;
}

int pt_gpu_pinned_reserve(pt_gpu *g, size_t bytes, char *err, size_t errlen) {
    if (!g) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_pinned_reserve: device is NULL");
    uint64_t size = bytes ? pt_gpu_round_size(bytes) : 0;
    if (bytes && !size)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "pt_gpu_pinned_reserve: %zu bytes cannot be represented", bytes);
    pthread_mutex_lock(&g->mu);
    if (g->pin_base && g->pin_live.n) {
        size_t n = g->pin_live.n;
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "pinned arena still holds %zu live allocation(s): free them before "
                       "reserving another arena",
                       n);
    }
    if (g->pin_base && g->pin_size == size) {   /* the same arena again: keep it */
        pthread_mutex_unlock(&g->mu);
        return PT_OK;
    }
    drop_arena(g);
    if (size == 0) {
        pthread_mutex_unlock(&g->mu);
        return PT_OK;
    }
    uint64_t budget = g->u.pinned_budget;
    if (budget && size > budget) {
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pinned arena of %" PRIu64 " bytes exceeds the %" PRIu64
                       "-byte pinned budget",
                       size, budget);
    }
    void *q = NULL;
    if (g->ops->host_alloc(g->impl, (size_t)size, &q) != PT_OK || !q) {
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pinned arena of %" PRIu64 " bytes could not be allocated on the %s "
                       "backend",
                       size, g->ops->name);
    }
    if (pt_ext_init(&g->pin, size) != 0) {
        g->ops->host_free(g->impl, q, (size_t)size);
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for the pinned arena");
    }
    g->pin_base = q;
    g->pin_size = size;
    g->u.pinned_arena = size;
    pthread_mutex_unlock(&g->mu);
    return PT_OK;
}

void pt_gpu_pinned_close(pt_gpu *g) {
    char msg[256];
    size_t n = g->pinned.n + g->pin_live.n;
    if (n) {
        snprintf(msg, sizeof msg,
                 "pt_gpu_close: %zu pinned allocations (%" PRIu64 " bytes) were never freed; "
                 "freeing them now",
                 n, g->u.pinned_current);
        g->log(g->log_user, PT_LOG_WARN, msg);
        for (size_t i = 0; i < g->pinned.cap; i++)
            if (g->pinned.keys[i])
                g->ops->host_free(g->impl, (void *)g->pinned.keys[i], (size_t)g->pinned.vals[i]);
    }
    pt_ptrmap_free(&g->pinned);
    drop_arena(g);
}
