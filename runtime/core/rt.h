/*
 * rt.h — the runtime the plugin's hooks turn into calls: memory policy,
 * parameter placement, activations, the optimizer. One pt_rt per plugin ctx.
 * Every call takes an error buffer; on failure it holds one sentence.
 * Hook ordering is checked by the plugin (plugin/lifecycle.c), not here.
 */
#ifndef PT_RT_H
#define PT_RT_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "gpu.h"
#include "protrain.h"

typedef struct pt_rt pt_rt;

/* sx: the caller's step state (read at every hook; it outlives the runtime). */
int pt_rt_create(const pt_config *cfg, const pt_host_v1 *host, const pt_logger *lg,
                 const pt_step_state *sx, pt_rt **out, char *err, size_t errlen);
/* Frees every byte, joins every thread; returns the count of leaked device allocations. */
size_t pt_rt_destroy(pt_rt *rt);

int pt_rt_model_load(pt_rt *rt, pt_model_v1 *model, char *err, size_t errlen);
/* Profiling at post_model_load (plan_rt.c): when pt_rt_profiling() after
 * pt_rt_model_load, the plugin runs pre_step-equivalent state, then
 * pt_rt_profile_begin, pt_rt_call_profile_step (the host re-enters the block
 * hooks), pt_rt_profile_end (trace -> search -> rebuild). */
int pt_rt_profiling(const pt_rt *rt);
int pt_rt_plan_from_cache(pt_rt *rt, int *hit, char *err, size_t errlen);
int pt_rt_profile_begin(pt_rt *rt, char *err, size_t errlen);
int pt_rt_call_profile_step(pt_rt *rt, char *err, size_t errlen);
int pt_rt_profile_end(pt_rt *rt, char *err, size_t errlen);
void pt_rt_profile_abort(pt_rt *rt);
int pt_rt_profile_passes(void);   /* profile_step calls per profile (2 warm-up + measured) */

/* After a failed post_model_load or create_optimizer: when a device allocation
 * failed during it, append to err the capacity this model and batch need under
 * the plan in force (exact where the store knows the footprint, else a lower
 * bound: the failing request plus what was in use) and what held the bytes.
 * Returns rc unchanged. */
int pt_rt_explain_oom(pt_rt *rt, int rc, char *err, size_t errlen);
/* rt_oom.c: the device's measuring mode from init (pt_gpu_measure_begin) ... */
void pt_rt_measure_setup(pt_rt *rt);
/* ... to the end of post_model_load: when the setup ran past the capacity,
 * fails with PT_ERR_OOM and the device size it needed (profiled: a profiling
 * step ran in the measurement); else explains rc as pt_rt_explain_oom. */
int pt_rt_setup_end(pt_rt *rt, int profiled, int rc, char *err, size_t errlen);
int pt_rt_create_optimizer(pt_rt *rt, const pt_optim_v1 *desc, char *err, size_t errlen);

int pt_rt_pre_step(pt_rt *rt, char *err, size_t errlen);   /* reads the step state */
int pt_rt_pre_forward(pt_rt *rt, int32_t b, char *err, size_t errlen);
int pt_rt_post_forward(pt_rt *rt, int32_t b, char *err, size_t errlen);
int pt_rt_pre_backward(pt_rt *rt, int32_t b, char *err, size_t errlen);
int pt_rt_post_backward(pt_rt *rt, int32_t b, char *err, size_t errlen);
int pt_rt_optimizer_step(pt_rt *rt, float lr, char *err, size_t errlen);
int pt_rt_set_lr(pt_rt *rt, float lr, char *err, size_t errlen);
/* The clip_grad_norm hook (pt_store_clip_grad_norm); the lifecycle checked the order. */
int pt_rt_clip_grad_norm(pt_rt *rt, float max_norm, double *norm, char *err, size_t errlen);
/* Host doubles summed over the ranks in rank order (no-op with one rank). */
int pt_rt_dist_allreduce(pt_rt *rt, double *values, int32_t n, char *err, size_t errlen);
/* This rank stops for the reason why: the other ranks' waits end with it
 * (pt_coll_abort; no-op with one rank). */
void pt_rt_dist_abort(pt_rt *rt, const char *why);
int pt_rt_post_step(pt_rt *rt, int64_t step, float loss, char *err, size_t errlen);
/* discard_step (rt_discard.c): the step in progress dropped (eval: an
 * evaluation pass, which holds no gradient); refused before any change when
 * it cannot be undone (store/discard.c), with several ranks, or while
 * profiling. */
int pt_rt_discard_step(pt_rt *rt, int eval, char *err, size_t errlen);
/* replan (rt_replan.c): profile and plan again for batch x seq, between steps.
 * profile(user) runs the profiling passes through the host's profile_step and
 * the search (the caller's, which owns the hook order) and returns a status
 * whose sentence is in err; on any failure the old shape and plan are rebuilt. */
typedef int (*pt_rt_profile_fn)(void *user);
int pt_rt_replan(pt_rt *rt, int64_t batch, int64_t seq, pt_rt_profile_fn profile, void *user,
                 char *err, size_t errlen);

int pt_rt_dev_alloc(pt_rt *rt, uint64_t bytes, const char *tag, void **ptr, char *err,
                    size_t errlen);
int pt_rt_dev_free(pt_rt *rt, void *ptr, char *err, size_t errlen);
int pt_rt_arena(pt_rt *rt, int32_t b, uint64_t bytes, void **ptr, char *err, size_t errlen);
int pt_rt_arena_get(pt_rt *rt, int32_t b, void **ptr, char *err, size_t errlen);
int pt_rt_memcpy(pt_rt *rt, void *dst, const void *src, uint64_t bytes, int32_t kind, char *err,
                 size_t errlen);
int pt_rt_stats(pt_rt *rt, pt_stats_v1 *out);
/* The host's work on the device's compute stream (protrain.h: launch, stream_sync). */
int pt_rt_launch(pt_rt *rt, void (*fn)(void *), void *arg, char *err, size_t errlen);
int pt_rt_stream_sync(pt_rt *rt, char *err, size_t errlen);
/* 1 on the thread running launched work (a hook called from there cannot touch
 * the context's error buffer or the lifecycle the host's thread owns). */
int pt_rt_ext_in_launch(void);
int pt_rt_save_state(pt_rt *rt, const char *dir, char *err, size_t errlen);
int pt_rt_load_state(pt_rt *rt, const char *dir, char *err, size_t errlen);
int pt_rt_read_param(pt_rt *rt, int32_t index, void *dst, uint64_t bytes, char *err,
                     size_t errlen);
/* The inverse of read_param, between steps (pt_store_write_param). */
int pt_rt_write_param(pt_rt *rt, int32_t index, const void *src, uint64_t bytes, char *err,
                      size_t errlen);

#endif
