/*
 * buffer_pool.c — device slots for streamed chunks; policy in buffer_pool.h.
 * Slot counts are small (n_buffer is a handful to a few dozen), so lookups and
 * victim selection are linear scans.
 */
#include "buffer_pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "protrain.h"

typedef struct slot {
    void *ptr;            /* [slot_bytes] device memory (host memory when g == NULL) */
    uint64_t stamp;       /* release counter value at the last release; 0 = never */
    int32_t chunk;        /* tag, -1 = none */
    int32_t leases;
} slot;

struct pt_bufpool {
    pt_gpu *g;
    pthread_mutex_t mu;
    int32_t n_slots;
    uint64_t slot_bytes;
    slot *slots;          /* [n_slots] */
    uint64_t clock;       /* release counter */
    int32_t last_evicted;
    pt_bufpool_stats st;
};

static int dev_alloc(pt_gpu *g, uint64_t bytes, void **p, char *err, size_t errlen) {
    if (g) return pt_gpu_alloc(g, (size_t)bytes, PT_TAG_BUFFER, p, err, errlen);
    *p = calloc(1, (size_t)bytes);
    if (!*p) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "buffer pool: out of host memory for a %llu-byte slot",
                       (unsigned long long)bytes);
    }
    return PT_OK;
}

static void dev_free(pt_gpu *g, void *p) {
    if (!p) return;
    if (g) pt_gpu_free(g, p);
    else free(p);
}

/* Slot by index, or NULL. */
static slot *get(pt_bufpool *bp, int32_t i) { return i >= 0 && i < bp->n_slots ? &bp->slots[i] : NULL; }

static int32_t find(const pt_bufpool *bp, int32_t chunk) {
    for (int32_t i = 0; i < bp->n_slots; i++)
        if (bp->slots[i].chunk == chunk) return i;
    return -1;
}

int pt_bufpool_create(pt_gpu *g, int32_t n_slots, uint64_t slot_bytes, pt_bufpool **out,
                      char *err, size_t errlen) {
    if (!out || n_slots < 0 || (n_slots > 0 && slot_bytes == 0)) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "buffer pool: bad arguments (%d slots of %llu bytes)",
                       (int)n_slots, (unsigned long long)slot_bytes);
    }
    *out = NULL;
    pt_bufpool *bp = calloc(1, sizeof *bp);
    if (bp) bp->slots = calloc((size_t)(n_slots ? n_slots : 1), sizeof *bp->slots);
    if (!bp || !bp->slots) {
        free(bp);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "buffer pool: out of host memory for %d slot records", (int)n_slots);
    }
    bp->g = g;
    bp->n_slots = n_slots;
    bp->slot_bytes = slot_bytes;
    bp->last_evicted = -1;
    pthread_mutex_init(&bp->mu, NULL);
    for (int32_t i = 0; i < n_slots; i++) {
        slot *s = &bp->slots[i];
        s->chunk = -1;
        char e2[256] = "";
        int rc = dev_alloc(g, slot_bytes, &s->ptr, e2, sizeof e2);
        if (rc) {
            pt_bufpool_destroy(bp);
            return pt_fail(err, errlen, rc, "buffer pool: slot %d of %d (%llu bytes each): %s", (int)i,
                           (int)n_slots, (unsigned long long)slot_bytes, e2);
        }
        bp->st.bytes_held += slot_bytes;
    }
    *out = bp;
    return PT_OK;
}

void pt_bufpool_destroy(pt_bufpool *bp) {
    if (!bp) return;
    for (int32_t i = 0; i < bp->n_slots; i++) dev_free(bp->g, bp->slots[i].ptr);
    pthread_mutex_destroy(&bp->mu);
    free(bp->slots);
    free(bp);
}

/* Caller holds mu. A hit, else an untagged unleased slot, else the LRU unleased one. */
static int acquire_locked(pt_bufpool *bp, int32_t chunk, int32_t *out, int32_t *hit, char *err,
                          size_t errlen) {
    int32_t i = find(bp, chunk);
    if (i >= 0) {
        get(bp, i)->leases++;
        bp->st.hits++;
        *out = i;
        *hit = 1;
        return PT_OK;
    }
    int32_t victim = -1;
    for (int32_t j = 0; j < bp->n_slots; j++) {
        const slot *s = &bp->slots[j];
        if (s->leases) continue;
        if (s->chunk < 0) {
            victim = j;
            break;
        }
        if (victim < 0 || s->stamp < bp->slots[victim].stamp) victim = j;
    }
    if (victim < 0) {
        char held[256] = "";
        size_t n = 0;
        for (int32_t j = 0; j < bp->n_slots && n + 12 < sizeof held; j++)
            n += (size_t)snprintf(held + n, sizeof held - n, " %d", (int)bp->slots[j].chunk);
        return pt_fail(err, errlen, PT_ERR_INTERNAL,
                       "buffer pool: all %d slots are leased (chunks%s), so chunk %d cannot be "
                       "gathered: n_buffer is below one block's chunks plus the prefetch",
                       (int)bp->n_slots, held, (int)chunk);
    }
    slot *s = &bp->slots[victim];
    if (s->chunk >= 0) {
        bp->st.evictions++;
        bp->last_evicted = s->chunk;
    }
    s->chunk = chunk;
    s->leases = 1;
    bp->st.misses++;
    *out = victim;
    *hit = 0;
    return PT_OK;
}

int pt_bufpool_acquire(pt_bufpool *bp, int32_t chunk, int32_t *slot_out, int32_t *hit, char *err,
                       size_t errlen) {
    if (!bp || !slot_out || !hit || chunk < 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "buffer pool: acquire of chunk %d with a NULL output or negative chunk", (int)chunk);
    pthread_mutex_lock(&bp->mu);
    bp->last_evicted = -1;
    bp->st.acquires++;
    int rc = acquire_locked(bp, chunk, slot_out, hit, err, errlen);
    if (rc) bp->st.acquires--;
    pthread_mutex_unlock(&bp->mu);
    return rc;
}

int pt_bufpool_release(pt_bufpool *bp, int32_t i, char *err, size_t errlen) {
    if (!bp) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "buffer pool: release of slot %d in a NULL pool", (int)i);
    pthread_mutex_lock(&bp->mu);
    slot *s = get(bp, i);
    int rc = PT_OK;
    if (!s || s->leases <= 0) {
        rc = pt_fail(err, errlen, PT_ERR_INVALID_ARG, "buffer pool: release of slot %d which %s", (int)i,
                     s ? "holds no lease (double release)" : "does not exist");
    } else if (--s->leases == 0) {
        s->stamp = ++bp->clock;
    }
    pthread_mutex_unlock(&bp->mu);
    return rc;
}

int pt_bufpool_invalidate(pt_bufpool *bp, int32_t chunk, char *err, size_t errlen) {
    if (!bp)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "buffer pool: invalidate of chunk %d in a NULL pool",
                       (int)chunk);
    pthread_mutex_lock(&bp->mu);
    int rc = PT_OK;
    int32_t i = find(bp, chunk);
    if (i >= 0) {
        slot *s = get(bp, i);
        if (s->leases) {
            rc = pt_fail(err, errlen, PT_ERR_INTERNAL,
                         "buffer pool: invalidate of chunk %d while slot %d holds %d lease(s) on it",
                         (int)chunk, (int)i, (int)s->leases);
        } else {
            s->chunk = -1;
        }
    }
    pthread_mutex_unlock(&bp->mu);
    return rc;
}

int32_t pt_bufpool_invalidate_all(pt_bufpool *bp) {
    if (!bp) return 0;
    pthread_mutex_lock(&bp->mu);
    int32_t kept = 0;
    for (int32_t i = 0; i < bp->n_slots; i++) {
        slot *s = &bp->slots[i];
        if (s->leases) kept += s->chunk >= 0;
        else s->chunk = -1;
    }
    pthread_mutex_unlock(&bp->mu);
    return kept;
}

int32_t pt_bufpool_lookup(pt_bufpool *bp, int32_t chunk) {
    if (!bp || chunk < 0) return -1;
    pthread_mutex_lock(&bp->mu);
    int32_t i = find(bp, chunk);
    pthread_mutex_unlock(&bp->mu);
    return i;
}

/* Read one field of a slot under the lock; dflt when the slot does not exist. */
#define SLOT_GETTER(name, type, expr, dflt) \
    type name(pt_bufpool *bp, int32_t i) { \
        if (!bp) return dflt; \
        pthread_mutex_lock(&bp->mu); \
        const slot *s = get(bp, i); \
        type v = s ? (expr) : dflt; \
        pthread_mutex_unlock(&bp->mu); \
        return v; \
    }
SLOT_GETTER(pt_bufpool_slot_ptr, void *, s->ptr, NULL)
SLOT_GETTER(pt_bufpool_slot_size, uint64_t, bp->slot_bytes, 0)
SLOT_GETTER(pt_bufpool_slot_chunk, int32_t, s->chunk, -1)
SLOT_GETTER(pt_bufpool_slot_leases, int32_t, s->leases, 0)
#undef SLOT_GETTER

int32_t pt_bufpool_last_evicted(pt_bufpool *bp) {
    if (!bp) return -1;
    pthread_mutex_lock(&bp->mu);
    int32_t c = bp->last_evicted;
    pthread_mutex_unlock(&bp->mu);
    return c;
}

int32_t pt_bufpool_n_slots(const pt_bufpool *bp) { return bp ? bp->n_slots : 0; }
uint64_t pt_bufpool_slot_bytes(const pt_bufpool *bp) { return bp ? bp->slot_bytes : 0; }

void pt_bufpool_stats_get(pt_bufpool *bp, pt_bufpool_stats *st) {
    if (!bp || !st) return;
    pthread_mutex_lock(&bp->mu);
    *st = bp->st;
    st->leased_slots = 0;
    for (int32_t i = 0; i < bp->n_slots; i++) st->leased_slots += bp->slots[i].leases > 0;
    pthread_mutex_unlock(&bp->mu);
}
