/* rt_internal.h — the runtime's private state, shared by rt.c and model_state*.c. */
#ifndef PT_RT_INTERNAL_H
#define PT_RT_INTERNAL_H

#include "rt.h"

enum { PT_ACT_NONE = 0, PT_ACT_CKPT = 1, PT_ACT_SWAP = 2 };

typedef struct pt_arena {
    int mode;             /* PT_ACT_* */
    void *ptr;            /* device bytes of the block's saved activations, or NULL */
    uint64_t bytes;       /* size the host asked for */
    int live;             /* forward saved it and its backward has not run yet */
    void *host;           /* SWAP: pinned copy */
    uint64_t host_bytes;
    int swapping_out, swapping_in;
    int32_t done_at;      /* SWAP: the last forward window holding the arena (plan), -1 = none */
    pt_event *ev_out, *ev_in;
} pt_arena;

typedef struct pt_optim_state {
    float lr, beta1, beta2, eps, weight_decay, max_grad_norm;
    int64_t t;            /* optimizer steps taken (bias correction uses t+1) */
    double last_norm;     /* global grad norm before clipping, NaN when not computed */
    int ready;
} pt_optim_state;

/* The four knobs the store and the activation policy run with (-1 = default:
 * everything persistent, lookahead buffers, no swap, no checkpoint). */
typedef struct pt_rt_knobs {
    int32_t n_persist, n_buffer, n_swap, n_checkpoint;
    const char *source;   /* "INI", "searched", "bootstrap" — for the log */
} pt_rt_knobs;

struct pt_ms;             /* model-state store (model_state.c) */
struct pt_prof;           /* profiler state while profile_step runs (profiler.c) */

struct pt_rt {
    pt_config cfg;
    pt_logger lg;
    pt_host_v1 host;
    pt_gpu *gpu;
    pt_stream *s_compute, *s_h2d, *s_d2h;
    pt_model_v1 *model;
    int n_blocks;
    pt_arena *arena;      /* [n_blocks] */
    pt_optim_state opt;
    struct pt_ms *ms;
    int64_t step;
    int32_t micro, n_micro;
    int eval;
    float lr_arg;         /* lr passed to optimizer_step (< 0: none) */
    float last_loss;
    uint64_t swap_out_bytes;  /* cumulative */
    int64_t recomputes;       /* cumulative recompute_block calls */
    struct pt_prof *prof;     /* non-NULL while profiling */
    pt_rt_knobs kn;           /* what the current store was built with */
    double prof_t0;
    double frag;              /* allocator fragmentation factor for the cost model */
    uint64_t pred_peak;       /* the plan's predicted peak and iteration time (0: no plan) */
    double pred_iter_s;
    struct pt_trace *trace;   /* the profile the plan came from (kept for re-planning) */
    int plan_clip;            /* the plan assumed clipping (deferred CPU steps) */
    int broken;               /* a failed rebuild left no usable store: every hook fails */
    int no_init_upload;       /* rebuilding: values come from a state image, not init */
    int calib_steps;          /* post_steps since the plan took effect */
    double calib_t[8];        /* their timestamps */
    uint64_t meas_peak;       /* measured at calibration (0: not yet) */
    double meas_iter_s;
    int swap_interval;        /* blocks of forward compute that hide one swap-out (>= 1) */
    int32_t *swap_done;       /* [n_blocks] the plan's release window per SWAP arena, or NULL */
};

int pt_rt_block_modes(pt_rt *rt, int32_t *modes, char *err, size_t errlen);
int pt_rt_build(pt_rt *rt, char *err, size_t errlen);
int pt_rt_wants_profile(const pt_rt *rt);   /* plan_rt.c */
void pt_rt_calibrate(pt_rt *rt);
int pt_rt_replan_for_optimizer(pt_rt *rt, int clip, char *err, size_t errlen);
void pt_rt_plan_free(pt_rt *rt);
struct pt_trace;
int pt_rt_search_and_apply(pt_rt *rt, const struct pt_trace *t, double prof_s, char *err,
                           size_t errlen);

/* activations.c */
const char *pt_acts_mode_name(int m);
int pt_acts_init(pt_rt *rt, const int32_t *modes, char *err, size_t errlen);
void pt_acts_fini(pt_rt *rt);
void pt_acts_reap(pt_rt *rt, int wait);
void pt_acts_pre_forward(pt_rt *rt, int32_t w);
int pt_acts_post_forward(pt_rt *rt, int32_t b, char *err, size_t errlen);
int pt_acts_pre_backward(pt_rt *rt, int32_t b, char *err, size_t errlen);
int pt_acts_post_backward(pt_rt *rt, int32_t b);

/* model_state.c */
uint64_t pt_param_numel(const pt_param_v1 *p);   /* product of the shape */
int pt_ms_validate(const pt_model_v1 *m, char *err, size_t errlen);
int pt_ms_load(pt_rt *rt, char *err, size_t errlen);
int pt_ms_optimizer_init(pt_rt *rt, char *err, size_t errlen);
int pt_ms_pre_step(pt_rt *rt, char *err, size_t errlen);
int pt_ms_gather(pt_rt *rt, int32_t b, int backward, char *err, size_t errlen);
int pt_ms_release(pt_rt *rt, int32_t b, int backward, char *err, size_t errlen);
int pt_ms_optimizer_step(pt_rt *rt, char *err, size_t errlen);
int pt_ms_set_lr(pt_rt *rt, float lr);
int pt_ms_read_param(pt_rt *rt, int32_t index, void *dst, uint64_t bytes, char *err,
                     size_t errlen);
void pt_ms_plan_stats(pt_rt *rt, pt_stats_v1 *s);
void pt_ms_destroy(pt_rt *rt);

#endif
