/*
 * buffer_pool.h — the device buffer pool for non-persistent chunks: n_buffer
 * slots of slot_bytes each, allocated once.
 *
 * Slots double as a cache. A released slot keeps its chunk tag, so a chunk used
 * late in forward is still there when backward (which runs in reverse) needs it:
 * acquire() then reports a hit and the caller skips the upload. On a miss the pool
 * takes, in this order, an untagged unleased slot (lowest index first), else the
 * unleased slot released longest ago (least-recently-released; releases are stamped
 * with a counter, not a clock, so the order is deterministic).
 *
 * Leases: every acquire adds one lease (two overlapping users of a chunk — the
 * running block and a prefetch for the next — each hold one); release drops one.
 * Only slots with zero leases are evicted. When every slot is leased, acquire fails
 * with PT_ERR_INTERNAL: the plan gave fewer buffers than one block plus its
 * prefetch need, which is a planner bug, not a user error.
 *
 * Every slot has the same size: an oversize chunk (one tensor larger than S_chunk)
 * never streams, because the store keeps it persistent, so the memory model charges
 * exactly n_slots * slot_bytes.
 *
 * Slot indices are 0 .. n_slots-1. The pool knows nothing of streams: the store
 * keeps its own per-slot event (the last gradient copy out of the slot).
 *
 * Device: with g != NULL slots come from pt_gpu_alloc (accounted, capacity-checked).
 * With g == NULL they are plain host memory from calloc (planning dry runs, tests).
 *
 * Thread safety: every call takes the pool's mutex, so the hook thread and stream
 * callbacks (host_fn releasing a slot after a D2H) may both call in.
 */
#ifndef PT_BUFFER_POOL_H
#define PT_BUFFER_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "gpu.h"

typedef struct pt_bufpool pt_bufpool;

typedef struct pt_bufpool_stats {
    uint64_t acquires, hits, misses, evictions;  /* evictions: misses that dropped a tag */
    uint64_t bytes_held;          /* device bytes of the slots */
    int32_t leased_slots;         /* slots with leases > 0 now */
} pt_bufpool_stats;

/* Allocate n_slots (>= 0) slots of slot_bytes (> 0 when n_slots > 0). On failure
 * (PT_ERR_OOM with the allocator's sentence, or PT_ERR_INVALID_ARG) nothing stays
 * allocated and *out is NULL. */
int pt_bufpool_create(pt_gpu *g, int32_t n_slots, uint64_t slot_bytes, pt_bufpool **out,
                      char *err, size_t errlen);
/* Frees every slot, leased or not. */
void pt_bufpool_destroy(pt_bufpool *bp);

/* Lease a slot holding `chunk` (>= 0). *hit = 1 when the slot already held it (no
 * upload needed), 0 when it was retagged (the caller must upload). PT_ERR_INTERNAL
 * when every slot is leased, PT_ERR_INVALID_ARG for a negative chunk or NULL
 * outputs; err gets one sentence. */
int pt_bufpool_acquire(pt_bufpool *bp, int32_t chunk, int32_t *slot, int32_t *hit, char *err,
                       size_t errlen);
/* Drop one lease; the tag stays. PT_ERR_INVALID_ARG for a bad slot or a slot with
 * no lease. */
int pt_bufpool_release(pt_bufpool *bp, int32_t slot, char *err, size_t errlen);

/* Forget the cached copy of `chunk` (e.g. the CPU optimizer rewrote the chunk, so
 * the slot is stale). No-op when not cached; PT_ERR_INTERNAL when it is leased. */
int pt_bufpool_invalidate(pt_bufpool *bp, int32_t chunk, char *err, size_t errlen);
/* Forget every unleased tag; returns the number of leased slots left tagged. */
int32_t pt_bufpool_invalidate_all(pt_bufpool *bp);

int32_t pt_bufpool_lookup(pt_bufpool *bp, int32_t chunk);   /* slot or -1; no lease */
void *pt_bufpool_slot_ptr(pt_bufpool *bp, int32_t slot);     /* NULL if invalid */
uint64_t pt_bufpool_slot_size(pt_bufpool *bp, int32_t slot); /* 0 if invalid */
int32_t pt_bufpool_slot_chunk(pt_bufpool *bp, int32_t slot); /* -1 if untagged/invalid */
int32_t pt_bufpool_slot_leases(pt_bufpool *bp, int32_t slot);
/* The chunk whose tag the last acquire dropped, or -1. */
int32_t pt_bufpool_last_evicted(pt_bufpool *bp);

int32_t pt_bufpool_n_slots(const pt_bufpool *bp);
uint64_t pt_bufpool_slot_bytes(const pt_bufpool *bp);
void pt_bufpool_stats_get(pt_bufpool *bp, pt_bufpool_stats *s);

#endif /* PT_BUFFER_POOL_H */
