/* profiler.h — hook-window timing and allocator readings during profile_step
 * (see profiler.c for the window definitions). */
#ifndef PT_PROFILER_H
#define PT_PROFILER_H

#include "rt_internal.h"
#include "planner/planner.h"

enum { PT_PROF_PRE_FWD = 0,
       PT_PROF_POST_FWD = 1,
       PT_PROF_PRE_BWD = 2,
       PT_PROF_POST_BWD = 3 };

/* Starts a pass; called again, starts the next pass keeping earlier timings
 * (the first two warm up, the trace takes the median of the rest). */
int pt_prof_begin(pt_rt *rt, char *err, size_t errlen);
int pt_prof_passes(void);
/* Called at entry (exit = 0) and exit (exit = 1) of each block hook while profiling. */
void pt_prof_hook(pt_rt *rt, int which, int32_t b, int exit);
/* The store's marks (PT_STORE_MARK_*): the device's clock right before
 * (after = 0) and after (after = 1) a CKPT block's recompute and the free of a
 * block's arena after its backward or (CKPT) its forward. */
void pt_prof_store_mark(pt_rt *rt, int kind, int32_t b, int after);
/* Builds the trace (blocks, chunks, non-block, hardware rates). */
int pt_prof_finish(pt_rt *rt, pt_trace *t, char *err, size_t errlen);
void pt_prof_free(pt_rt *rt);
/* The cache key of this model on this device (architecture hash, B, T, device, world). */
void pt_prof_key(pt_rt *rt, pt_trace_key *k);

#endif
