/*
 * dev_access.c — what the host may touch on the device: the range checks of
 * its copies and frees (device_ext.h: pt_gpu_host_range, pt_gpu_free_host).
 *
 * Every device byte lies in one block of the reservation (device.c), and each
 * live block knows whether it is the host's (dev_alloc) or the plugin's. A
 * host copy's device side must lie, whole, inside the requested bytes of one
 * live block that is the host's, an activation arena, parameter or gradient
 * storage, or scratch the plugin hands out; a copy that starts inside a block
 * and runs on would write over the next allocation. The checks are pointer
 * arithmetic on the block list, the same on every backend.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "device_internal.h"
#include "pt_util.h"

/* The block (live or free) whose extent holds p, or NULL when p is outside
 * the reservation. A walk of the address-ordered list: host copies and frees
 * are a few per step, the list a few hundred blocks. */
static const pt_blk *block_at(const pt_gpu *g, const void *p) {
    if (!g->base || !p) return NULL;
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)g->base;
    const pt_blk *x = g->dev.first;
    if (a < lo || a - lo >= g->u.capacity) {
        /* the overflow range of a measuring setup (device.c) */
        lo = (uintptr_t)g->ovf_base;
        if (!g->ovf_base || a < lo || a - lo >= g->ovf_size) return NULL;
        x = g->ovf.first;
    }
    uint64_t off = (uint64_t)(a - lo);
    for (; x; x = x->next)
        if (off >= x->off && off - x->off < x->size) return x;
    return NULL;
}

/* What a plugin block holds, by its tag, for the sentences below. */
static const char *plugin_role(int tag) {
    switch (tag) {
    case PT_TAG_PARAM: return "parameter storage";
    case PT_TAG_GRAD: return "gradient storage";
    case PT_TAG_OPTIM: return "optimizer state";
    case PT_TAG_BUFFER: return "chunk buffer (parameters and gradients)";
    case PT_TAG_ACT: return "activation arena";
    case PT_TAG_SCRATCH: return "scratch buffer";
    default: return "internal buffer";
    }
}

/* Plugin blocks the host reaches through the ABI: parameters and gradients
 * (param->data / param->grad), arenas, the tile and OSFT scratch. Optimizer
 * state and the plugin's bookkeeping (PT_TAG_OTHER) are never handed out. */
static int host_reachable(const pt_blk *x) {
    return x->host || (x->tag != PT_TAG_OPTIM && x->tag != PT_TAG_OTHER);
}

void pt_gpu_describe_locked(const pt_gpu *g, const void *p, char *buf, size_t n) {
    const pt_blk *x = block_at(g, p);
    if (!x || x->state != 1) {
        snprintf(buf, n, "it lies in no live device allocation (never allocated here, already "
                         "freed, or not device memory)");
        return;
    }
    uint64_t into = (uint64_t)((uintptr_t)p - (uintptr_t)pt_gpu_blk_addr(g, x));
    const char *what = x->host ? "a dev_alloc block" : "the plugin's";
    const char *role = x->host ? "" : plugin_role(x->tag);
    if (into)
        snprintf(buf, n, "it lies %" PRIu64 " bytes into %s%s%s of %" PRIu64 " bytes at %p",
                 into, what, x->host ? "" : " ", role, x->req, (void *)pt_gpu_blk_addr(g, x));
    else if (x->host)
        snprintf(buf, n, "it is a dev_alloc block of %" PRIu64 " bytes", x->req);
    else
        snprintf(buf, n, "it is the plugin's %s (%" PRIu64 " bytes), which the plugin frees",
                 role, x->req);
}

int pt_gpu_host_range(const pt_gpu *g, const void *p, size_t bytes, char *why, size_t whylen) {
    if (!g) return 0;
    pthread_mutex_lock(pt_gpu_mu(g));
    const pt_blk *x = block_at(g, p);
    int ok = 0;
    if (!x || x->state != 1) {
        snprintf(why, whylen, "is not device memory (it does not lie inside a live allocation "
                              "from dev_alloc, an arena or a parameter)");
    } else if (!host_reachable(x)) {
        snprintf(why, whylen, "lies in the plugin's %s (%" PRIu64 " bytes at %p), which the "
                              "host may not copy to or from",
                 plugin_role(x->tag), x->req,
                 (void *)pt_gpu_blk_addr(g, x));
    } else {
        uint64_t into = (uint64_t)((uintptr_t)p - (uintptr_t)pt_gpu_blk_addr(g, x));
        uint64_t room = into < x->req ? x->req - into : 0;
        ok = bytes <= room;
        if (!ok)
            snprintf(why, whylen, "runs past the end of its allocation: it starts %" PRIu64 " bytes into %s%s of %" PRIu64 " bytes at %p, so %" PRIu64 " bytes fit",
                     into, x->host ? "a dev_alloc block" : "the plugin's ",
                     x->host ? "" : plugin_role(x->tag), x->req, (void *)pt_gpu_blk_addr(g, x),
                     room);
    }
    pthread_mutex_unlock(pt_gpu_mu(g));
    return ok;
}
