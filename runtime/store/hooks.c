/*
 * hooks.c — the store's side of each block hook: chunks and activations in the
 * order the host's next computation needs them, and the arena queries the
 * runtime's host services make.
 */
#include "store_internal.h"

/* Forward of b: swapped arenas whose plan window ended leave first (their
 * bytes are free before b's chunks arrive), then b's chunks are gathered. */
int pt_store_pre_forward(pt_store *st, int32_t b, char *err, size_t errlen) {
    int rc = pt_acts_pre_forward(st, b, err, errlen);
    return rc ? rc : pt_ms_gather(st, b, 0, err, errlen);
}

int pt_store_post_forward(pt_store *st, int32_t b, char *err, size_t errlen) {
    int rc = pt_ms_release(st, b, 0, err, errlen);
    return rc ? rc : pt_acts_post_forward(st, b, err, errlen);
}

/* Parameters first, then activations: a CKPT recompute reads the block's params. */
int pt_store_pre_backward(pt_store *st, int32_t b, char *err, size_t errlen) {
    int rc = pt_cs_dist_poll(st, err, errlen);   /* gradient buckets whose backward ended */
    if (!rc) rc = pt_ms_gather(st, b, 1, err, errlen);
    return rc ? rc : pt_acts_pre_backward(st, b, err, errlen);
}

int pt_store_post_backward(pt_store *st, int32_t b, char *err, size_t errlen) {
    int rc = pt_ms_release(st, b, 1, err, errlen);
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
