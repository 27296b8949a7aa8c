/*
 * rt_internal.h — the runtime context, private to runtime/core: rt.c (hooks
 * and host services), plan_rt.c (profile, search, rebuild, calibration) and
 * profiler.c. The chunk store and the planner are reached through their
 * interfaces (store/store.h, planner/planner.h).
 */
#ifndef PT_RT_INTERNAL_H
#define PT_RT_INTERNAL_H

#include "coll/coll.h"
#include "rt.h"
#include "store/ord_bits.h"
#include "store/store.h"

struct pt_prof;           /* profiler state while profile_step runs (profiler.c) */
struct pt_trace;
struct pt_plan;

/* The most features that extend the runtime object (rt_ext.c's list). */
#define PT_RT_EXT_MAX 4

struct pt_rt {
    pt_config cfg;
    pt_logger lg;
    pt_host_v1 host;
    pt_coll *solo;            /* world 1 under an MPI launcher: the MPI group that checked
                                 it (kept open to the end, so MPI starts and ends once) */
    pt_model_v1 *model;       /* what the store lays out: the host's model, or with OSFT
                                 the expanded list holding the factors (osft.h) */
    pt_model_v1 *hmodel;      /* the host's model (its descriptors get the addresses) */
    void *ext_state[PT_RT_EXT_MAX]; /* each feature's own state (pt_rt_ext_state), or NULL */
    int n_blocks;
    pt_optim_state opt;
    int opt_created;          /* create_optimizer succeeded */
    const pt_step_state *sx;  /* where the host is in its step (the lifecycle's) */
    pt_store *st;             /* the store under the plan in force, or NULL */
    float last_loss;
    const char *prof_hook;    /* the hook profiling runs in, for errors (NULL: post_model_load) */
    int broken;               /* a failed rebuild left no usable store: every hook fails */
    /* device services: the device layer, its streams and the ordering after the host's */
    struct {
        pt_gpu *gpu;
        pt_stream *s_compute, *s_h2d, *s_d2h;
        int host_async;           /* the host set PT_HOST_ASYNC_COMPUTE */
        int launch_queued;        /* launch queues on s_compute (host backend, async_compute) */
        int adopted_compute;      /* s_compute is the host's own stream: not ours to destroy */
        int ordered;              /* order plugin work after the host's with events */
        unsigned skip;            /* PT_ORD_* orderings a test switched off */
    } dev;
    /* the ranks: collectives and what they agree on */
    struct {
        /* the host's fingerprint, kept (pt_agree_keep_fingerprint): the host's own
         * text is only valid during init, and host.fingerprint points here after */
        char fingerprint[PT_HOST_FINGERPRINT_MAX + 1];
        pt_coll *coll;            /* data-parallel collectives (world > 1), else NULL */
        pt_coll *tp_coll, *dp_coll; /* sub-groups of coll with [dist] tp_size > 1 (store.h) */
        int shard;                /* mode C: offloaded chunks split across the ranks (with coll) */
    } dist;
    /* the plan in force and the profile it came from */
    struct {
        pt_store_knobs kn;        /* what the current store was built with */
        struct pt_prof *prof;     /* non-NULL while profiling */
        double prof_t0;
        uint64_t pred_peak;       /* the plan's predicted peak and iteration time (0: no plan) */
        double pred_iter_s;
        struct pt_trace *trace;   /* the profile the plan came from (kept for re-planning) */
        int plan_clip;            /* the plan assumed clipping (deferred CPU steps) */
        int plan_tp_l2;           /* the plan assumed tensor-parallel REKLS gathers the weights (l2) */
        double pred_coll[3];      /* the plan's all-reduce / all-gather / reduce-scatter s per iteration */
        double pred_fwd_s, pred_bwd_s, pred_opt_s;  /* the plan's phases (cost model) */
        /* [nvme] path: the disk tier's rates (profiler_disk.h), probed once per
         * run at the first search (0: not yet), and where they came from */
        double tier_rd_Bps, tier_wr_Bps;
        char tier_rates[160];
        int swap_interval;        /* blocks of forward compute that hide one swap-out (>= 1) */
        int32_t *swap_done;       /* [n_blocks] the plan's release window per SWAP arena, or NULL */
        struct pt_timeline *tl;   /* timeline_file set: the plan's memory picture, kept so calibration
                                     can write it again with the measured peak; else NULL */
    } plan;
    /* calibration: the measured steps against the plan (calib.c) */
    struct {
        int calib_steps;          /* post_steps since the plan took effect */
        double calib_t[8];        /* their timestamps */
        uint64_t meas_peak;       /* measured at calibration (0: not yet) */
        double coll0[3];          /* the store's collective seconds when calibration's measuring began */
        double meas_iter_s;
        pt_event *cal_ev[4];      /* PT_CAL_* timing events on s_compute (calib.c) */
        unsigned cal_seen;        /* PT_CAL_* bits recorded in the running step */
        double cal_ph[5][3];      /* measured steps' forward, backward, optimizer phases (s) */
        int cal_ok[5];            /* that step's phases were timed */
        int time_replans;         /* re-plans a time misprediction caused in this run */
    } cal;
};

/* A feature that extends the runtime object (osft/, tiled/): rt.c and
 * plan_rt.c call every registered one at these points, in registration order
 * (rt_ext.c), and name none of them. Any entry may be NULL. `active` says the
 * feature is in force for the model loaded (OSFT: it found targets); the
 * entries that take the store's place (chunk_stepped, read_param, launch) are
 * used only while it is, the others are called always and do nothing when the
 * feature is off. A feature keeps its own state behind one pointer in the
 * runtime object (pt_rt_ext_state / pt_rt_ext_set_state), which it allocates
 * and frees; the core never sees its type. */
typedef struct pt_rt_keys {
    void *t;
    void (*put)(void *t, const char *name, const char *value);
} pt_rt_keys;
typedef struct pt_rt_ext {
    const char *name;
    int (*active)(const pt_rt *rt);
    /* at create, before anything is opened: a combination of the configuration
     * the feature cannot run (with another feature, or with tensor
     * parallelism), as a sentence; NULL when it can */
    const char *(*refuse)(const pt_config *cfg);
    /* init's rank agreement (dist_agree.h): the feature's INI keys that fix the
     * math, one keys->put per key in a fixed order */
    void (*agree_keys)(const pt_config *cfg, const pt_rt_keys *keys);
    /* the profile cache key: h mixed (pt_rt_key_mix) with the feature's settings
     * that change what a profile measures */
    uint64_t (*cache_key)(const pt_config *cfg, uint64_t h);
    /* the feature picks a knob of its own from a fresh profile (TiledMLP's tiles
     * = auto): when wants_search says so, search runs the planner's search
     * (pt_rt_search_and_apply, once or more) in its place, and a cached profile,
     * which lacks what it measures, is not used (search_what names the setting) */
    int (*wants_search)(const pt_rt *rt);
    int (*search)(pt_rt *rt, const struct pt_trace *t, double prof_s, char *err, size_t errlen);
    const char *search_what;
    /* the plan before it is printed: the feature's fields */
    void (*plan_fill)(const pt_rt *rt, struct pt_plan *plan);
    /* pt_rt_destroy, after model_unload: free the feature's state */
    void (*fini)(pt_rt *rt);
    /* post_model_load, before the store is built: refuse what the feature cannot
     * run, or point rt->model at the list the store lays out (rt->hmodel stays
     * the host's, which rt.c set before) */
    int (*model_load)(pt_rt *rt, pt_model_v1 *host, char *err, size_t errlen);
    /* undo model_load (a later feature refused, another model, finalize) */
    void (*model_unload)(pt_rt *rt);
    /* create_optimizer: refuse an optimizer type the feature was not built with */
    int (*optimizer_check)(const pt_rt *rt, int type, char *err, size_t errlen);
    /* after every hook and whenever the store moved parameters (built, loaded,
     * gathered for a recompute): the host's descriptors get the addresses */
    void (*after_hook)(pt_rt *rt);
    /* a failure inside work the host launched (it could not return it), once;
     * checked before the next gradient or step work and at stream_sync */
    int (*async_status)(pt_rt *rt, char *err, size_t errlen);
    /* block b's gradients are final, before the store's post_backward */
    int (*block_backward)(pt_rt *rt, int32_t b, char *err, size_t errlen);
    /* after the store's optimizer step */
    int (*after_optimizer_step)(pt_rt *rt, char *err, size_t errlen);
    /* on the CPU worker that just stepped offloaded chunk `chunk` (store.h) */
    void (*chunk_stepped)(pt_rt *rt, int32_t chunk);
    /* load_state replaced the parameter values */
    void (*state_loaded)(pt_rt *rt);
    /* read_param of host index `index` in place of the store's */
    int (*read_param)(pt_rt *rt, int32_t index, void *dst, uint64_t bytes, char *err,
                      size_t errlen);
    /* launch with queued work in place of the plain host_fn */
    int (*launch)(pt_rt *rt, void (*fn)(void *), void *arg, char *err, size_t errlen);
    /* get_stats: the fields the feature owns */
    void (*stats)(const pt_rt *rt, pt_stats_v1 *s);
    /* after the plan's summary: the feature's lines */
    void (*plan_log)(const pt_rt *rt);
} pt_rt_ext;

/* rt_ext.c: each extension point, over the features in order. model_load
 * sets rt->model = rt->hmodel = model first and, when one refuses, undoes the
 * ones before it and clears both; the ones returning a status stop at the
 * first failure. chunk_stepped: the store's callback, or NULL when no feature
 * in force needs it; reader / launcher: the feature in force that takes
 * read_param / launch, or NULL. */
typedef void (*pt_rt_stepped_fn)(void *user, int32_t chunk);
int pt_rt_ext_model_load(pt_rt *rt, pt_model_v1 *model, char *err, size_t errlen);
void pt_rt_ext_unload(pt_rt *rt);
int pt_rt_ext_optimizer_check(const pt_rt *rt, int type, char *err, size_t errlen);
void pt_rt_ext_after_hook(pt_rt *rt);
int pt_rt_ext_async_status(pt_rt *rt, char *err, size_t errlen);
int pt_rt_ext_block_backward(pt_rt *rt, int32_t b, char *err, size_t errlen);
int pt_rt_ext_after_optimizer_step(pt_rt *rt, char *err, size_t errlen);
pt_rt_stepped_fn pt_rt_ext_chunk_stepped(const pt_rt *rt);
void pt_rt_ext_state_loaded(pt_rt *rt);
const pt_rt_ext *pt_rt_ext_reader(const pt_rt *rt);
const pt_rt_ext *pt_rt_ext_launcher(const pt_rt *rt);
void pt_rt_ext_stats(const pt_rt *rt, pt_stats_v1 *s);
void pt_rt_ext_plan_log(const pt_rt *rt);
/* The first refusal of a feature (NULL: none); the features' agreement keys;
 * h mixed with every feature's cache key; the feature searching in place of
 * the planner's plain search, or NULL; the plan's feature fields; the
 * features' fini. */
const char *pt_rt_ext_refuse(const pt_config *cfg);
void pt_rt_ext_agree_keys(const pt_config *cfg, const pt_rt_keys *keys);
uint64_t pt_rt_ext_cache_key(const pt_config *cfg, uint64_t h);
const pt_rt_ext *pt_rt_ext_searcher(const pt_rt *rt);
void pt_rt_ext_plan_fill(const pt_rt *rt, struct pt_plan *plan);
void pt_rt_ext_fini(pt_rt *rt);
/* Feature e's state in rt (NULL until it sets one), and setting it. */
void *pt_rt_ext_state(const pt_rt *rt, const pt_rt_ext *e);
void pt_rt_ext_set_state(pt_rt *rt, const pt_rt_ext *e, void *state);
/* A cache key's mixing step: h combined with the FNV-1a 64 of n bytes at p. */
static inline uint64_t pt_rt_key_mix(uint64_t h, const void *p, size_t n) {
    return h ^ (pt_fnv1a64(p, n) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}

/* rt_build.c */
int pt_rt_build(pt_rt *rt, int from_image, char *err, size_t errlen);
/* Frees the store; the status of its wait for queued work (err NULL: logged). */
int pt_rt_store_free(pt_rt *rt, char *err, size_t errlen);
/* rt_hooks.c: PT_ERR_ORDER naming `what` unless the store (and, need_opt, the
 * optimizer's state) exists. */
int pt_rt_need_store(pt_rt *rt, const char *what, int need_opt, char *err, size_t errlen);

/* calib.c: marks on the device's clock at the phase edges of a measured step,
 * and the calibration at post_step (peak and time against the plan). */
enum { PT_CAL_PRE = 0,
       PT_CAL_BWD = 1,
       PT_CAL_OPT = 2,
       PT_CAL_END = 3,
       PT_CAL_N = 4 };
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
