/*
 * placement.c — the block-mode rule documented in placement.h.
 */
#include "placement.h"
#include "protrain.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

int pt_place_swap_interval(const pt_trace *t) {
    int best = 1;
    if (!t || t->hw.d2h_Bps <= 0) return t && t->n_block > 0 ? t->n_block : 1;
    for (int32_t b = 0; b < t->n_block; b++) {
        const pt_trace_block *B = &t->blocks[b];
        if (B->fwd_s <= 0 || B->arena_bytes == 0) continue;
        double ratio = ((double)B->arena_bytes / t->hw.d2h_Bps) / B->fwd_s;
        /* ceil with a relative tolerance so 2.0000000001 from rounding stays 2. */
        double i = ceil(ratio * (1.0 - 1e-12));
        if (i < 1) i = 1;
        if (i > t->n_block) i = t->n_block;   /* more than N only means "one swap" */
        if ((int)i > best) best = (int)i;
    }
    return best;
}

int pt_place_swap_cap(int n_block, int interval) {
    if (n_block <= 0) return 0;
    if (interval < 1) interval = 1;
    return (n_block + interval - 1) / interval;
}

int pt_place_blocks(int n_block, int n_swap, int n_checkpoint, int interval, uint8_t *modes, char *err,
                    size_t errlen) {
    if (n_block < 1 || n_swap < 0 || n_checkpoint < 0 || n_swap > n_block - n_checkpoint || !modes) {
        if (err && errlen)
            snprintf(err, errlen, "placement: n_swap=%d + n_checkpoint=%d must be >= 0 and at most n_block=%d",
                     n_swap, n_checkpoint, n_block);
        return PT_ERR_INVALID_ARG;
    }
    if (interval < 1) interval = 1;
    memset(modes, PT_BLOCK_NONE, (size_t)n_block);
    int pos = 0, ck_left = n_checkpoint;
    if (n_swap > 0) {
        int gaps = n_swap - 1;
        long want = (long)gaps * (interval - 1);
        int g = (int)(want < ck_left ? want : ck_left);
        int base = gaps ? g / gaps : 0, extra = gaps ? g % gaps : 0;
        for (int i = 0; i < n_swap; i++) {
            modes[pos++] = PT_BLOCK_SWAP;
            if (i == gaps) break;
            int fill = base + (i < extra ? 1 : 0);
            for (int j = 0; j < fill; j++) modes[pos++] = PT_BLOCK_CKPT;
        }
        ck_left -= g;
    }
    /* Remaining CKPT centred over the R blocks after the swap region. */
    long R = n_block - pos;
    for (long k = 0; k < ck_left; k++) {
        long off = ((2 * k + 1) * R) / (2L * ck_left);
        modes[pos + off] = PT_BLOCK_CKPT;
    }
    return PT_OK;
}

void pt_place_modes_string(const uint8_t *modes, int n_block, char *buf, size_t len) {
    if (!buf || !len) return;
    size_t n = 0;
    for (int b = 0; b < n_block && n + 1 < len; b++)
        buf[n++] = modes[b] == PT_BLOCK_SWAP ? 'S' : modes[b] == PT_BLOCK_CKPT ? 'C'
                                                                               : 'N';
    if (n_block > 0 && (size_t)n_block >= len && n > 0) buf[n - 1] = '~';
    buf[n] = 0;
}
