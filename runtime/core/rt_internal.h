/*
 * rt_internal.h — the runtime context, private to runtime/core: rt.c (hooks
 * and host services), plan_rt.c (profile, search, rebuild, calibration) and
 * profiler.c. The chunk store and the planner are reached through their
 * interfaces (store/store.h, planner/planner.h).
 */
#ifndef PT_RT_INTERNAL_H
#define PT_RT_INTERNAL_H

#include "coll.h"
#include "rt.h"
#include "store/store.h"

struct pt_prof;           /* profiler state while profile_step runs (profiler.c) */
struct pt_trace;

struct pt_rt {
    pt_config cfg;
    pt_logger lg;
    pt_host_v1 host;
    pt_gpu *gpu;
    pt_coll *coll;            /* data-parallel collectives (world > 1), else NULL */
    pt_coll *tp_coll, *dp_coll; /* sub-groups of coll with [dist] tp_size > 1 (store.h) */
    int shard;                /* mode C: offloaded chunks split across the ranks (with coll) */
    pt_stream *s_compute, *s_h2d, *s_d2h;
    pt_model_v1 *model;       /* what the store lays out: the host's model, or with OSFT
                                 the expanded list holding the factors (osft.h) */
    pt_model_v1 *hmodel;      /* the host's model (its descriptors get the addresses) */
    struct pt_osft *osft;     /* OSFT targets and factors, or NULL */
    int n_blocks;
    pt_optim_state opt;
    int opt_created;          /* create_optimizer succeeded */
    const pt_step_state *sx;  /* where the host is in its step (the lifecycle's) */
    pt_store *st;             /* the store under the plan in force, or NULL */
    int host_async;           /* the host set PT_HOST_ASYNC_COMPUTE */
    int launch_queued;        /* launch queues on s_compute (host backend, async_compute) */
    int adopted_compute;      /* s_compute is the host's own stream: not ours to destroy */
    int ordered;              /* order plugin work after the host's with events */
    unsigned skip;            /* PT_ORD_* orderings a test switched off */
    pt_store_knobs kn;        /* what the current store was built with */
    float last_loss;
    struct pt_prof *prof;     /* non-NULL while profiling */
    double prof_t0;
    uint64_t pred_peak;       /* the plan's predicted peak and iteration time (0: no plan) */
    double pred_iter_s;
    struct pt_trace *trace;   /* the profile the plan came from (kept for re-planning) */
    int plan_clip;            /* the plan assumed clipping (deferred CPU steps) */
    int plan_tp_l2;           /* the plan assumed tensor-parallel REKLS gathers the weights (l2) */
    int broken;               /* a failed rebuild left no usable store: every hook fails */
    int calib_steps;          /* post_steps since the plan took effect */
    double calib_t[8];        /* their timestamps */
    uint64_t meas_peak;       /* measured at calibration (0: not yet) */
    double pred_coll[3];      /* the plan's all-reduce / all-gather / reduce-scatter s per iteration */
    double coll0[3];          /* the store's collective seconds when calibration's measuring began */
    double meas_iter_s;
    double pred_fwd_s, pred_bwd_s, pred_opt_s;  /* the plan's phases (cost model) */
    pt_event *cal_ev[4];      /* PT_CAL_* timing events on s_compute (calib.c) */
    unsigned cal_seen;        /* PT_CAL_* bits recorded in the running step */
    double cal_ph[5][3];      /* measured steps' forward, backward, optimizer phases (s) */
    int cal_ok[5];            /* that step's phases were timed */
    int time_replans;         /* re-plans a time misprediction caused in this run */
    int swap_interval;        /* blocks of forward compute that hide one swap-out (>= 1) */
    int32_t *swap_done;       /* [n_blocks] the plan's release window per SWAP arena, or NULL */
    struct pt_timeline *tl;   /* timeline_file set: the plan's memory picture, kept so calibration
                                 can write it again with the measured peak; else NULL */
    /* TiledMLP (tiled_mlp.c) */
    int in_tiles;             /* inside a tiled_mlp_forward/backward tile loop */
    void *tile_scr;           /* the tile scratch handed to the host, or NULL */
    uint64_t tile_scr_bytes;
    int64_t tile_count;       /* rows of the tile being run; tile_bwd: inside a backward */
    int tile_bwd;
    uint64_t tile_tok[2];     /* device bytes of tile scratch per row seen, forward / backward */
    int64_t mlp_auto_n;       /* tiles = auto: the count chosen (0: not yet, the profile's) */
};

/* rt.c */
int pt_rt_build(pt_rt *rt, int from_image, char *err, size_t errlen);
/* Frees the store; the status of its wait for queued work (err NULL: logged). */
int pt_rt_store_free(pt_rt *rt, char *err, size_t errlen);

/* tiled_mlp.c: at post_model_load, refuse what TiledMLP cannot run (non-fp32
 * gradients, a host without the callbacks). */
int pt_rt_tiled_check(pt_rt *rt, char *err, size_t errlen);
/* The tile count asked for: the INI's, the auto choice, or (0) the profiling rule. */
int64_t pt_rt_tiles_req(const pt_rt *rt);
/* tiles = auto: search with the profile t adjusted to each candidate count, fewest
 * first; applies the first plan that fits (pt_rt_search_and_apply). */
int pt_rt_tiles_auto_search(pt_rt *rt, const struct pt_trace *t, double prof_s, char *err,
                            size_t errlen);

/* calib.c: marks on the device's clock at the phase edges of a measured step,
 * and the calibration at post_step (peak and time against the plan). */
enum { PT_CAL_PRE = 0, PT_CAL_BWD = 1, PT_CAL_OPT = 2, PT_CAL_END = 3, PT_CAL_N = 4 };
/* calib.c: a phase edge of a measured step (hook names the caller in errors),
 * and the end of a step (its sample; after the measured steps, the comparison
 * and any re-plan). A failed device op returns PT_ERR_BACKEND. */
int pt_rt_calib_mark(pt_rt *rt, int which, const char *hook, char *err, size_t errlen);
int pt_rt_calibrate(pt_rt *rt, char *err, size_t errlen);
void pt_rt_calib_free(pt_rt *rt);

/* plan_rt.c */
int pt_rt_wants_profile(const pt_rt *rt);
/* Several ranks, auto_mode and zero3_shard = auto: the search picks B or C. */
int pt_rt_auto_shard(const pt_rt *rt);
int pt_rt_replan_for_optimizer(pt_rt *rt, int clip, char *err, size_t errlen);
void pt_rt_plan_free(pt_rt *rt);
int pt_rt_search_and_apply(pt_rt *rt, const struct pt_trace *t, double prof_s, char *err,
                           size_t errlen);

#endif
