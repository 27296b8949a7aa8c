/*
 * profiler_internal.h — what the profiler's two files share: the per-pass
 * record (profiler.c times the hook windows into it, profiler_hw.c the
 * hardware rates between and after the passes) and its failure record.
 */
#ifndef PT_PROFILER_INTERNAL_H
#define PT_PROFILER_INTERNAL_H

#include <stdio.h>

#include "profiler.h"

/* Timings are kept per pass: the first PROF_WARM passes warm caches, page
 * mappings, BLAS and the host's thread teams and are dropped; the trace takes
 * the median of the others per window. Two, because one was not enough: on a
 * 2-core VM (sample_host, 4 blocks) the second pass's forward still ran
 * 1.2-1.5x the later passes' in 13 of 14 processes (e.g. 11.4, 7.7, 8.1 ms),
 * and with it in a median of three the profile's compute came out slow. */
#define PROF_WARM 2
#define PROF_PASSES 7

/* Window edges of a pass: one event each, recorded on the compute stream. */
enum { E_XPF,
       E_EPO,
       E_XPB,
       E_EPB,
       E_FR0,
       E_FR1,
       E_FF0,
       E_FF1,
       E_RC0,
       E_RC1,
       E_PER_BLOCK };   /* [b] each */
enum { E_T0,
       E_PF0,
       E_HD0,
       E_HD1,
       E_EB0,
       E_END,
       E_GLOBAL };       /* after the blocks */

struct pt_prof {
    int n;
    int pass;                       /* current pass, 0-based */
    pt_event **ev;                  /* [E_PER_BLOCK * n + E_GLOBAL] */
    unsigned char *ev_set;          /* recorded in this pass */
    uint64_t c0;                    /* bytes at the current window's start */
    uint64_t head_c0;
    double *fwd, *bwd, *rec;        /* [PROF_PASSES][n] seconds */
    double *frb;                    /* [PROF_PASSES][n]: the free of the arena after
                                       the block's backward, E_FR0 .. E_FR1 */
    double *frf;                    /* [PROF_PASSES][n]: after its forward (every block
                                       is CKPT in the profile), E_FF0 .. E_FF1 */
    uint64_t *arena, *input, *fscr, *bscr;
    uint64_t nonblock, nonblock_scr;
    double embed_fwd[PROF_PASSES], embed_bwd[PROF_PASSES], head[PROF_PASSES];
    /* Fragmentation: every window resets the allocator's peak, so each window's
     * reading is folded in before the next reset. fr holds the reading of the
     * window with the highest peak; span the highest span of any window. */
    int win_open;
    pt_gpu_usage fr;
    uint64_t span;
    /* The first failed device op of the profile. The window marks run inside
     * block hooks that must not fail for the profiler's sake mid-pass, and a
     * missing edge would silently time a window as 0 s: the failure is kept
     * and returned by the next pt_prof_begin or by pt_prof_finish, both inside
     * the hook that runs the profile. */
    int rc;
    char why[384];
    /* mode C's collectives the store ran (seconds, bytes) when the measured
     * passes began */
    double cs0[3], cb0[3];
    /* between passes (sweep_between): the device AdamW over scratch as
     * optimizer_step runs it, its seconds after each pass that is not the first
     * (sweep_t[0..n_sweep)), over sweep_elems elements in sweep_launches
     * launches (each with its gradient memset) */
    double sweep_t[PROF_PASSES];
    int n_sweep, sweep_launches;
    uint64_t sweep_elems;
};

static inline void prof_failed_rc(struct pt_prof *p, int rc, const char *what) {
    if (p->rc) return;
    p->rc = rc;
    snprintf(p->why, sizeof p->why, "%s", what);
}
static inline void prof_failed(struct pt_prof *p, const char *what) {
    prof_failed_rc(p, PT_ERR_BACKEND, what);
}

static inline int prof_status(struct pt_prof *p, char *err, size_t errlen) {
    return p->rc ? pt_fail(err, errlen, p->rc, "profiler: %s", p->why) : PT_OK;
}

/* profiler_hw.c: the device AdamW over scratch between two passes (the caller
 * keeps the scratch out of the windows' memory readings; timed = 0: a warm-up,
 * not kept), and the hardware rates at the end of a profile. dtype: the
 * trainable parameters' dtype. */
void pt_prof_sweep(pt_rt *rt, int timed);
void pt_prof_measure_hw(pt_rt *rt, pt_trace *t, int dtype);

#endif
