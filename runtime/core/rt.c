/*
 * rt.c — runtime context, device services for the host (dev_alloc, arenas,
 * memcpy, stats) and the hook entry points. Parameter storage, activations
 * and the optimizer live in the chunk store (store/store.h); this file
 * builds the store under the plan in force and wires it to the hooks.
 */
#include "rt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ext.h"
#include "dist_agree.h"
#include "planner/planner.h"
#include "profiler.h"
#include "rt_internal.h"

/* save/load/read need the store and (save/load) the optimizer's state. */
static int need_store(pt_rt *rt, const char *what, int need_opt, char *err, size_t errlen) {
    if (!rt->st || (need_opt && !pt_store_optimizer_ready(rt->st)))
        return pt_fail(err, errlen, PT_ERR_ORDER, "%s needs post_model_load%s first", what,
                       need_opt ? " and create_optimizer" : "");
    return PT_OK;
}

static void gpu_log(void *user, int32_t level, const char *msg) {
    pt_log(&((pt_rt *)user)->lg, level, "%s", msg);
}

/* Tensor parallel of size P inside data parallel: groups of P consecutive
 * ranks (group rank = rank % P holds shard rank % P of every split param), and
 * the world / P ranks that hold the same shard, one per group, across which
 * gradients are averaged (none when world == P). */
static int tp_groups(pt_rt *rt, int P, char *err, size_t errlen) {
    int r = pt_coll_rank(rt->coll), W = pt_coll_world(rt->coll);
    int rc = pt_coll_split(rt->coll, r / P, r, &rt->tp_coll, err, errlen);
    if (!rc && W > P) rc = pt_coll_split(rt->coll, r % P, r, &rt->dp_coll, err, errlen);
    if (!rc)
        PT_LOGI(&rt->lg, "tensor-parallel group %d of %d (ranks %d..%d, this rank %d in it); "
                "gradients averaged over %d replica(s)", r / P, W / P, r / P * P,
                r / P * P + P - 1, r % P, W / P);
    return rc;
}

/* Configured features this build does not have, as a sentence (NULL: none). */
static const char *unbuilt(const pt_config *cfg, const pt_host_v1 *host) {
    const char *missing = NULL;
    if (cfg->osft_enabled && cfg->tiled_mlp_enabled)
        missing = "[osft] enabled with [tiled_mlp] enabled: TiledMLP's per-tile gradient "
                  "accumulator does not know the OSFT factors yet; enable one of them";
    else if (host && host->world_size > 1 && !strcmp(cfg->dist_backend, "none"))
        missing = "[dist] backend = none with world_size > 1: the ranks could not agree on "
                  "gradients";
    else if (cfg->tp_size > 1 && cfg->osft_enabled)
        missing = "[dist] tp_size > 1 with [osft] enabled: OSFT's factors are not split over a "
                  "tensor-parallel group yet; set tp_size = 1 or disable OSFT";
    else if (cfg->tp_size > 1 && cfg->zero3_shard == 1)
        missing = "[dist] tp_size > 1 with [protrain] zero3_shard = on: mode C (sharded "
                  "optimizer states) is not combined with tensor parallelism yet";
    else if (cfg->tp_size > 1 && (!host || host->world_size % cfg->tp_size))
        missing = "[dist] tp_size does not divide world_size: the ranks must form whole "
                  "tensor-parallel groups";
    else if (cfg->tp_size > 1 && host->device_kind == PT_DEVICE_CUDA)
        missing = "[dist] tp_size > 1 on the cuda backend: tensor parallelism runs on the host "
                  "backend only (its REKLS gathers have not run over NCCL)";
    return missing;
}

/* The device layer's configuration from the INI and the host's device index. */
static int gpu_config(const pt_config *cfg, const pt_host_v1 *host, pt_gpu_config *gc, char *err,
                      size_t errlen) {
    gc->device_index = host ? host->device_index : 0;
    gc->capacity = cfg->device_capacity;
    gc->pinned_budget = cfg->pinned_budget;
    gc->copy_bandwidth = cfg->copy_bandwidth;
    gc->poison = cfg->poison;
    gc->poison_native = cfg->cuda_poison;
    gc->fail_alloc_at = cfg->fail_alloc_at;
    char bad[256];
    if (pt_gpu_fail_op_parse(cfg->fail_op, &gc->fail_op, &gc->fail_op_at, bad, sizeof bad))
        /* the INI checker refuses this first; a config built in code may not */
        return pt_fail(err, errlen, PT_ERR_CONFIG, "[testing] fail_op = '%s': %s",
                       cfg->fail_op, bad);
    gc->compute_jitter_s = cfg->compute_jitter;
    snprintf(gc->trace_file, sizeof gc->trace_file, "%s", cfg->host_trace_file);
    gc->jitter_seed = (uint64_t)cfg->jitter_seed;
    return PT_OK;
}

/* The compute stream (the host's own on cuda, which the plugin orders against)
 * and the two copy streams. */
static int open_streams(pt_rt *rt, const pt_host_v1 *host, char *err, size_t errlen) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
    void *impl = pt_gpu_impl(rt->gpu);
    int rc;
    if (host && host->compute_stream) {
        if ((rc = pt_gpu_adopt_stream(rt->gpu, host->compute_stream, &rt->s_compute, err,
                                      errlen)))
            return rc;
        rt->adopted_compute = 1;
    } else if ((rc = ops->stream_create(impl, &rt->s_compute))) {
        rt->s_compute = NULL;
    }
    if (rc || !rt->s_compute || (rc = ops->stream_create(impl, &rt->s_h2d)) ||
        (rc = ops->stream_create(impl, &rt->s_d2h)))
        return pt_fail(err, errlen, PT_ERR_BACKEND, "cannot create device streams on the %s backend",
                       pt_gpu_backend_name(rt->gpu));
    return PT_OK;
}

/* How the plugin's work is ordered after the host's (PT_HOST_ASYNC_COMPUTE). */
static void set_ordering(pt_rt *rt, const pt_config *cfg, const pt_host_v1 *host) {
    rt->host_async = host && (host->flags & PT_HOST_ASYNC_COMPUTE);
    rt->launch_queued = rt->host_async && cfg->async_compute &&
                        !strcmp(pt_gpu_backend_name(rt->gpu), "host");
    rt->ordered = rt->host_async;
    rt->skip = (unsigned)cfg->debug_skip_ordering;
    if (rt->host_async && rt->skip)
        PT_LOGW(&rt->lg, "[testing] debug_skip_ordering = %u: the plugin skips some of its "
                         "ordering after the host's compute (a testing aid: training is wrong)",
                rt->skip);
}

/* Several ranks: the collectives, and the tensor-parallel groups. */
static int open_dist(pt_rt *rt, const pt_config *cfg, const pt_host_v1 *host, char *err,
                     size_t errlen) {
    /* the transport follows the device backend actually opened (auto may
     * have fallen back to host): nccl on cuda, mpi on host */
    const char *tr = NULL;
    const char *dev = pt_gpu_backend_name(rt->gpu);
    int rc = pt_coll_pick(cfg->dist_backend, dev, cfg->init_method, &tr, err, errlen);
    if (rc) return rc;
    if (cfg->tp_size > 1 && strcmp(tr, "mpi"))
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "[dist] tp_size > 1 runs on the "
                       "host backend's mpi transport only (config %s)", cfg->source);
    pt_coll_config cc = {host->world_size, host->rank, cfg->init_method,
                         (double)cfg->dist_timeout, cfg->debug_hang_rank, tr,
                         host->device_index, NULL};
    if ((rc = pt_coll_open(&cc, &rt->coll, err, errlen)) || (rc = pt_agree_init(rt, err, errlen)))
        return rc;
    if (cfg->tp_size > 1 && (rc = tp_groups(rt, cfg->tp_size, err, errlen))) return rc;
    PT_LOGI(&rt->lg, "%s: rank %d of %d over %s on the %s backend (init_method %s, "
                     "timeout %g s)",
            cfg->tp_size > 1 ? "tensor parallel" : "data parallel", host->rank,
            host->world_size, tr, dev, cfg->init_method, (double)cfg->dist_timeout);
    return PT_OK;
}

int pt_rt_create(const pt_config *cfg, const pt_host_v1 *host, const pt_logger *lg,
                 const pt_step_state *sx, pt_rt **out, char *err, size_t errlen) {
    *out = NULL;
    pt_rt *rt = calloc(1, sizeof *rt);
    if (!rt) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory creating the runtime");
    }
    rt->cfg = *cfg;
    rt->lg = *lg;
    rt->sx = sx;
    rt->plan_clip = cfg->max_grad_norm > 0;
    if (host) {
        size_t n = host->struct_size < sizeof rt->host ? host->struct_size : sizeof rt->host;
        memcpy(&rt->host, host, n);
    }
    /* Configured features this build does not have: say so now, not mid-run. */
    const char *missing = unbuilt(cfg, host);
    if (missing) {
        free(rt);
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "%s (config %s)", missing, cfg->source);
    }
    pt_gpu_config gc = {0};
    int rc = gpu_config(cfg, host, &gc, err, errlen);
    if (rc) {
        free(rt);
        return rc;
    }
    const char *kind = cfg->backend;
    if (host && host->device_kind == PT_DEVICE_HOST) kind = "host";
    if (host && host->device_kind == PT_DEVICE_CUDA) kind = "cuda";
    if (strcmp(kind, cfg->backend) && strcmp(cfg->backend, "auto"))
        PT_LOGW(&rt->lg, "the host asks for the %s backend; [plugin] backend = %s in %s is not "
                         "used", kind, cfg->backend, cfg->source);
    if ((rc = pt_gpu_open(kind, &gc, &rt->gpu, err, errlen))) {
        free(rt);
        return rc;
    }
    if ((rc = open_streams(rt, host, err, errlen))) {
        pt_rt_destroy(rt);
        return rc;
    }
    /* the device layer's reports (leaks at close, backend failures) go to the log */
    pt_gpu_set_log(rt->gpu, gpu_log, rt);
    const char *why = pt_gpu_fallback_reason(rt->gpu);
    if (why && *why)
        PT_LOGW(&rt->lg, "backend = auto: the cuda backend was not used (%s); running on the "
                         "simulated host device", why);
    set_ordering(rt, cfg, host);
    if (host && host->world_size > 1 && (rc = open_dist(rt, cfg, host, err, errlen))) {
        pt_rt_destroy(rt);
        return rc;
    }
    char name[128];
    pt_gpu_device_name(rt->gpu, name, sizeof name);
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->gpu, &u);
    PT_LOGI(&rt->lg, "backend %s (%s), device capacity %.1f MiB, config %s",
            pt_gpu_backend_name(rt->gpu), name, u.capacity / 1048576.0, cfg->source);
    *out = rt;
    return PT_OK;
}

size_t pt_rt_destroy(pt_rt *rt) {
    if (!rt) return 0;
    (void)pt_rt_store_free(rt, NULL, 0);   /* logged: finalize goes on */
    pt_rt_ext_unload(rt);
    pt_rt_plan_free(rt);
    pt_coll_close(rt->dp_coll);   /* sub-groups before their group */
    pt_coll_close(rt->tp_coll);
    pt_coll_close(rt->coll);
    rt->coll = NULL;
    size_t leaked = 0;
    pt_rt_calib_free(rt);
    if (rt->gpu) {
        const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
        void *impl = pt_gpu_impl(rt->gpu);
        if (rt->s_compute && !rt->adopted_compute) ops->stream_destroy(impl, rt->s_compute);
        if (rt->s_h2d) ops->stream_destroy(impl, rt->s_h2d);
        if (rt->s_d2h) ops->stream_destroy(impl, rt->s_d2h);
        leaked = pt_gpu_live_allocs(rt->gpu);
        if (leaked)
            PT_LOGW(&rt->lg, "finalize: %zu device allocation(s) made through dev_alloc were "
                             "never freed by the host; reclaimed", leaked);
        pt_gpu_close(rt->gpu);
    }
    free(rt);
    return leaked;
}

int pt_rt_model_load(pt_rt *rt, pt_model_v1 *model, char *err, size_t errlen) {
    if (!model || model->n_params <= 0 || !model->params || model->n_blocks < 0) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: model descriptor is empty (n_params %d, n_blocks %d)",
            model ? model->n_params : 0, model ? model->n_blocks : 0);
    }
    int rc = pt_store_validate(model, err, errlen);
    if (rc) return rc;
    pt_gpu_oom_reset(rt->gpu);   /* pt_rt_explain_oom speaks of this call only */
    /* a retry after a failed post_model_load starts from nothing */
    (void)pt_rt_store_free(rt, NULL, 0);
    pt_rt_plan_free(rt);
    rt->broken = 0;
    /* the features may refuse the model or replace the list the store lays out */
    if ((rc = pt_rt_ext_model_load(rt, model, err, errlen))) return rc;
    rt->n_blocks = model->n_blocks;
    rt->kn.n_persist = rt->cfg.force_all_persistent ? -1 : rt->cfg.n_persist;
    rt->kn.n_buffer = rt->cfg.n_buffer;
    rt->kn.n_swap = rt->cfg.n_swap;
    rt->kn.n_checkpoint = rt->cfg.n_checkpoint;
    rt->kn.source = rt->cfg.force_all_persistent ? "force_all_persistent" : "INI";
    /* mode C when asked for (several ranks only) */
    rt->shard = rt->coll && rt->cfg.zero3_shard == 1;
    if (pt_rt_wants_profile(rt)) {
        /* auto_mode may pick C after the search: profile sharded, which needs
         * the least pinned memory (the profile records the replicated figures) */
        if (pt_rt_auto_shard(rt)) rt->shard = 1;
        /* bootstrap: stream every chunk through the minimal pool, checkpoint every
         * block — what fits if anything does, so profiling itself never OOMs
         * where a plan exists */
        rt->kn.n_persist = 0;
        rt->kn.n_buffer = -1;
        rt->kn.n_swap = 0;
        rt->kn.n_checkpoint = model->n_blocks;
        rt->kn.source = "bootstrap";
    }
    return pt_rt_build(rt, 0, err, errlen);
}

/* Per-block activation modes from (n_swap, n_checkpoint) — INI overrides until
 * the searcher decides — by the placement rule of runtime/placement.h. The swap
 * interval comes from the profile when there is one, else 1. */
static int block_modes(pt_rt *rt, int32_t *modes, char *err, size_t errlen) {
    int n = rt->n_blocks;
    int ns = rt->kn.n_swap > 0 ? rt->kn.n_swap : 0;
    int nc = rt->kn.n_checkpoint > 0 ? rt->kn.n_checkpoint : 0;
    uint8_t *m8 = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!m8) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    int rc = pt_place_blocks(n, ns, nc, rt->swap_interval > 0 ? rt->swap_interval : 1, m8, err,
                             errlen);
    if (rc) {
        free(m8);
        return PT_ERR_CONFIG;
    }
    for (int b = 0; b < n; b++) modes[b] = m8[b];
    char map[512];
    pt_modes_string(m8, n, map, sizeof map);
    free(m8);
    PT_LOGI(&rt->lg, "activation modes (N NONE, C CKPT, S SWAP): %s", n ? map : "(no blocks)");
    return PT_OK;
}

static void store_mark(void *user, int kind, int32_t b, int after) {
    pt_rt *rt = user;
    /* the host's recompute reads its descriptors: the addresses the store's
     * gather just set must be there (OSFT keeps them in its own list) */
    if (kind == PT_STORE_MARK_RECOMPUTE && !after) pt_rt_ext_after_hook(rt);
    if (rt->prof) pt_prof_store_mark(rt, kind, b, after);
}

int pt_rt_store_free(pt_rt *rt, char *err, size_t errlen) {
    int rc = pt_store_destroy(rt->st, err, errlen);
    rt->st = NULL;
    return rc;
}

/* (Re)build the store and the activation policy from rt->kn; from_image: the
 * caller restores parameter values from a state image next. */
int pt_rt_build(pt_rt *rt, int from_image, char *err, size_t errlen) {
    /* the store's destructor can only log a failed wait; here a hook is
     * running, so the failure is its error and the old store stays */
    int rc = pt_store_sync(rt->st, err, errlen);
    if (rc) return rc;
    if ((rc = pt_rt_store_free(rt, err, errlen))) return rc;
    int32_t *modes = calloc((size_t)(rt->n_blocks > 0 ? rt->n_blocks : 1), sizeof *modes);
    if (!modes) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    rc = block_modes(rt, modes, err, errlen);
    int n_ckpt = 0;
    for (int b = 0; b < rt->n_blocks; b++) n_ckpt += modes[b] == PT_ACT_CKPT;
    if (!rc && n_ckpt && !rt->host.recompute_block) {
        /* found now, not at the first backward (where it surfaced as a bare
         * "profile_step returned 10") */
        rc = !strcmp(rt->kn.source, "bootstrap")
            ? pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                      "post_model_load: profiling runs a bootstrap plan that checkpoints every "
                      "block (CKPT, recomputed through the host's recompute_block callback), but "
                      "pt_host_v1.recompute_block is NULL: give the callback, or skip profiling "
                      "([protrain] auto_memory = false with every n_* set and n_checkpoint = 0, "
                      "or force_all_persistent = true)")
            : pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                      "the plan checkpoints %d block(s) (n_checkpoint, %s), which needs the "
                      "host's recompute_block callback, but pt_host_v1.recompute_block is NULL: "
                      "give the callback or set [protrain] n_checkpoint = 0", n_ckpt,
                      rt->kn.source);
    }
    if (!rc) {
        pt_store_env env = {&rt->cfg, &rt->lg, &rt->host, rt->gpu, rt->s_compute, rt->s_h2d,
                            rt->s_d2h, rt->model, &rt->opt, rt->sx, store_mark, rt,
                            rt->ordered, rt->skip, rt->coll, rt->shard, rt->tp_coll,
                            rt->dp_coll, pt_rt_ext_chunk_stepped(rt)};
        /* chunk_stepped: after an offloaded chunk's CPU step, on its worker, a
         * feature's work on the values the step changed there (OSFT's
         * projection), so nothing waits for other chunks' steps */
        rc = pt_store_create(&env, &rt->kn, modes, rt->swap_done, from_image, &rt->st, err,
                             errlen);
        pt_rt_ext_after_hook(rt);
    }
    free(modes);
    /* peaks from here on belong to the plan in force (not to profiling) */
    pt_gpu_reset_peak(rt->gpu);
    rt->calib_steps = 0;
    return rc;
}

int pt_rt_create_optimizer(pt_rt *rt, const pt_optim_v1 *d, char *err, size_t errlen) {
    pt_optim_state *o = &rt->opt;
    const pt_config *c = &rt->cfg;
    int type = (d && d->type != PT_OPTIM_FROM_CONFIG) ? d->type : c->optim_type;
    if (type != PT_OPTIM_ADAMW && type != PT_OPTIM_REKLS) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "create_optimizer: optimizer type %d is "
                       "unknown (%d = adamw, %d = rekls)", type, PT_OPTIM_ADAMW, PT_OPTIM_REKLS);
    }
    int crc = pt_rt_ext_optimizer_check(rt, type, err, errlen);
    if (crc) return crc;
    /* Into a copy first: a refused descriptor leaves the optimizer as it was. */
    pt_optim_state n = *o;
    static const char *const names[6] = {"lr", "beta1", "beta2", "eps", "weight_decay",
                                         "max_grad_norm"};
    const float given[6] = {d ? d->lr : NAN, d ? d->beta1 : NAN, d ? d->beta2 : NAN,
                            d ? d->eps : NAN, d ? d->weight_decay : NAN,
                            d ? d->max_grad_norm : NAN};
    /* NaN means "from the INI"; an infinity is a host mistake, never a setting */
    for (int i = 0; i < 6; i++)
        if (isinf(given[i]))
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "create_optimizer: pt_optim_v1.%s is %g; it must be finite (NaN = "
                           "from the INI)", names[i], (double)given[i]);
    n.lr = !isnan(given[0]) ? given[0] : c->lr;
    n.beta1 = !isnan(given[1]) ? given[1] : c->beta1;
    /* [optimizer] beta2 = auto (NaN): the reference's default of the optimizer
     * actually chosen, 0.95 for REKLS (betas (0.9, 0.95)), 0.999 for AdamW */
    n.beta2 = !isnan(given[2]) ? given[2]
              : !isnan(c->beta2) ? c->beta2
              : type == PT_OPTIM_REKLS ? 0.95f : 0.999f;
    n.eps = !isnan(given[3]) ? given[3] : c->eps;
    /* [optimizer] weight_decay = auto (NaN), the same way: REKLS's reference
     * default 0.01, AdamW's 0 (what every AdamW run had before auto existed) */
    n.weight_decay = !isnan(given[4]) ? given[4]
                     : !isnan(c->weight_decay) ? c->weight_decay
                     : type == PT_OPTIM_REKLS ? 0.01f : 0.0f;
    n.max_grad_norm = !isnan(given[5]) ? given[5] : c->max_grad_norm;
    if (!(n.lr >= 0) || !(n.beta1 >= 0 && n.beta1 < 1) || !(n.beta2 >= 0 && n.beta2 < 1) ||
        !(n.eps > 0) || !(n.weight_decay >= 0)) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "create_optimizer: bad hyper-parameters lr %g beta1 %g beta2 %g eps %g weight_decay %g "
            "(need lr >= 0, betas in [0,1), eps > 0, weight_decay >= 0)",
            n.lr, n.beta1, n.beta2, n.eps, n.weight_decay);
    }
    n.type = type;
    n.lr0 = n.lr;
    /* A host porting REKLS(eps=...) gives its eps in the descriptor: it is REKLS's
     * eps then (the descriptor wins over the INI, as for every other field), and
     * the AdamW eps of the parameters REKLS does not take, the same number. */
    n.rekls_eps = !isnan(given[3]) ? given[3] : c->rekls_eps;
    *o = n;
    pt_gpu_oom_reset(rt->gpu);
    o->t = 0;
    o->last_norm = NAN;
    if (type == PT_OPTIM_REKLS)
        PT_LOGI(&rt->lg, "optimizer rekls lr %g betas (%g, %g) shampoo_beta %g eps %g "
                "weight_decay %g (%s) step 1 %s clip %s; AdamW (eps %g, decoupled decay) for "
                "the parameters REKLS does not take", o->lr, o->beta1, o->beta2,
                c->rekls_shampoo_beta, o->rekls_eps, o->weight_decay,
                c->rekls_wd_method == 1 ? "independent" : c->rekls_wd_method == 2 ? "l2"
                : c->rekls_wd_method == 3 ? "palm" : "decoupled",
                c->rekls_seed_shampoo ? "seeded with Shampoo factors" : "as the reference",
                o->max_grad_norm > 0 ? "global-norm" : "off", o->eps);
    else
        PT_LOGI(&rt->lg, "optimizer adamw lr %g betas (%g, %g) eps %g weight_decay %g clip %s",
                o->lr, o->beta1, o->beta2, o->eps, o->weight_decay,
                o->max_grad_norm > 0 ? "global-norm" : "off");
    int rc = pt_rt_replan_for_optimizer(rt, o->max_grad_norm > 0, err, errlen);
    if (!rc) rc = pt_store_optimizer_init(rt->st, err, errlen);
    rt->opt_created = !rc;
    return rc;
}

int pt_rt_pre_step(pt_rt *rt, char *err, size_t errlen) {
    if (rt->broken) {
        return pt_fail(err, errlen, rt->broken, "pre_step: the plugin lost its state in a failed re-plan (see the log)");
    }
    int rc = pt_store_pre_step(rt->st, err, errlen);
    pt_rt_ext_after_hook(rt);
    if (!rc && rt->sx->micro == 0) rc = pt_rt_calib_mark(rt, PT_CAL_PRE, "pre_step", err, errlen);
    return rc;
}

/* A block hook: the store's work, bracketed by the profiler's window marks
 * while profiling. */
typedef int (*store_hook)(pt_store *st, int32_t b, char *err, size_t errlen);
static int hook(pt_rt *rt, int which, store_hook fn, int32_t b, char *err, size_t errlen) {
    if (rt->prof) pt_prof_hook(rt, which, b, 0);
    int rc = fn(rt->st, b, err, errlen);
    if (rt->prof) pt_prof_hook(rt, which, b, 1);
    pt_rt_ext_after_hook(rt);
    return rc;
}

int pt_rt_pre_forward(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    return hook(rt, PT_PROF_PRE_FWD, pt_store_pre_forward, b, err, errlen);
}
int pt_rt_post_forward(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    return hook(rt, PT_PROF_POST_FWD, pt_store_post_forward, b, err, errlen);
}
int pt_rt_pre_backward(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    if (b == rt->n_blocks - 1) {
        int rc = pt_rt_calib_mark(rt, PT_CAL_BWD, "block_pre_backward", err, errlen);
        if (rc) return rc;
    }
    return hook(rt, PT_PROF_PRE_BWD, pt_store_pre_backward, b, err, errlen);
}
int pt_rt_post_backward(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    /* the features' gradient work (OSFT's projection), queued behind the
     * block's backward and before the store copies, reduces or offloads it */
    int rc = pt_rt_ext_async_status(rt, err, errlen);
    if (!rc) rc = pt_rt_ext_block_backward(rt, b, err, errlen);
    return rc ? rc : hook(rt, PT_PROF_POST_BWD, pt_store_post_backward, b, err, errlen);
}

int pt_rt_optimizer_step(pt_rt *rt, float lr, char *err, size_t errlen) {
    int rc = pt_rt_calib_mark(rt, PT_CAL_OPT, "optimizer_step", err, errlen);
    if (!rc) rc = pt_rt_ext_async_status(rt, err, errlen);
    if (!rc) rc = pt_store_optimizer_step(rt->st, lr, err, errlen);
    if (!rc) rc = pt_rt_ext_after_optimizer_step(rt, err, errlen);
    pt_rt_ext_after_hook(rt);
    return rc;
}

int pt_rt_dist_allreduce(pt_rt *rt, double *values, int32_t n, char *err, size_t errlen) {
    if (n < 0 || (n > 0 && !values))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "dist_allreduce: values is NULL or n (%d) is negative", (int)n);
    if (!rt->coll) return PT_OK;
    return pt_coll_allreduce(rt->coll, values, (size_t)n, PT_COLL_F64, 1.0, "dist_allreduce",
                             err, errlen);
}

int pt_rt_set_lr(pt_rt *rt, float lr, char *err, size_t errlen) {
    if (!(lr >= 0) || isinf(lr)) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "set_lr: lr is %g; it must be finite "
                       "and >= 0", (double)lr);
    }
    if (!rt->st) {
        return pt_fail(err, errlen, PT_ERR_ORDER, "hook set_lr called out of order: expected post_model_load first");
    }
    return pt_store_set_lr(rt->st, lr);
}

int pt_rt_post_step(pt_rt *rt, int64_t step, float loss, char *err, size_t errlen) {
    rt->last_loss = loss;
    PT_LOGD(&rt->lg, "step %lld loss %.6f grad-norm %.6g", (long long)step, (double)loss,
            rt->opt.last_norm);
    int rc = pt_rt_calib_mark(rt, PT_CAL_END, "post_step", err, errlen);
    if (!rc) rc = pt_rt_calibrate(rt, err, errlen);
    if (rc) return rc;
    if (rt->broken) {
        return pt_fail(err, errlen, rt->broken, "post_step: the calibration re-plan failed (see the log); the run cannot continue");
    }
    return PT_OK;
}

int pt_rt_save_state(pt_rt *rt, const char *dir, char *err, size_t errlen) {
    int rc = need_store(rt, "save_state", 1, err, errlen);
    return rc ? rc : pt_store_save(rt->st, dir, err, errlen);
}

int pt_rt_load_state(pt_rt *rt, const char *dir, char *err, size_t errlen) {
    int rc = need_store(rt, "load_state", 1, err, errlen);
    if (!rc) rc = pt_store_load(rt->st, dir, err, errlen);
    pt_rt_ext_state_loaded(rt);
    pt_rt_ext_after_hook(rt);
    return rc;
}

/* ---- host memory services ---- */

int pt_rt_dev_alloc(pt_rt *rt, uint64_t bytes, const char *tag, void **ptr, char *err,
                    size_t errlen) {
    if (!ptr) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "dev_alloc: ptr is NULL");
    }
    *ptr = NULL;
    if (bytes == 0) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "dev_alloc: zero-byte request (tag %s)", tag ? tag : "(none)");
    }
    return pt_gpu_alloc_host(rt->gpu, (size_t)bytes, pt_mem_tag_parse(tag), ptr, err, errlen);
}

int pt_rt_dev_free(pt_rt *rt, void *ptr, char *err, size_t errlen) {
    if (!ptr) return PT_OK;
    int b = pt_store_is_arena(rt->st, ptr);
    if (b >= 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "dev_free: %p is block %d's activation arena, which the plugin owns", ptr, b);
    /* the host's queued kernels may still use it: free in the compute stream's
     * order; only the host's own blocks (a parameter's address is the plugin's) */
    pt_stream *s = rt->ordered && !(rt->skip & PT_ORD_FREE) ? rt->s_compute : NULL;
    return pt_gpu_free_host(rt->gpu, ptr, s, err, errlen);
}

int pt_rt_arena(pt_rt *rt, int32_t b, uint64_t bytes, void **ptr, char *err, size_t errlen) {
    int rc = need_store(rt, "activation_arena", 0, err, errlen);
    return rc ? rc : pt_store_arena(rt->st, b, bytes, ptr, err, errlen);
}

int pt_rt_arena_get(pt_rt *rt, int32_t b, void **ptr, char *err, size_t errlen) {
    int rc = need_store(rt, "activation_arena_get", 0, err, errlen);
    return rc ? rc : pt_store_arena_get(rt->st, b, ptr, err, errlen);
}

int pt_rt_memcpy(pt_rt *rt, void *dst, const void *src, uint64_t bytes, int32_t kind, char *err,
                 size_t errlen) {
    if ((!dst || !src) && bytes) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "memcpy: NULL pointer");
    }
    if (kind < PT_COPY_H2D || kind > PT_COPY_D2D) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "memcpy: unknown copy kind %d (0 H2D, 1 D2H, 2 D2D)", kind);
    }
    /* The device side must lie, whole, in one allocation the host may use: a
     * range that starts in a block and runs on would overwrite the next one
     * (on the simulated device it would also let a host address "work" that
     * faults on a GPU). Pointer arithmetic on the block list: every backend. */
    if (bytes) {
        static const char *const kn[] = {"H2D", "D2H", "D2D"};
        char why[320];
        const void *bad = NULL;
        const char *side = NULL;
        if (kind != PT_COPY_D2H && !pt_gpu_host_range(rt->gpu, dst, (size_t)bytes, why, sizeof why))
            bad = dst, side = "destination";
        else if (kind != PT_COPY_H2D &&
                 !pt_gpu_host_range(rt->gpu, src, (size_t)bytes, why, sizeof why))
            bad = src, side = "source";
        if (bad)
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "memcpy(%s, %llu bytes): the %s %p %s",
                           kn[kind], (unsigned long long)bytes, side, bad, why);
    }
    /* a copy on the compute stream: after the host's launched work */
    int rc = rt->ordered && !(rt->skip & PT_ORD_HOSTIO) ? pt_rt_stream_sync(rt, err, errlen) : PT_OK;
    if (rc) return rc;
    char e[256];
    rc = pt_gpu_memcpy_sync(rt->gpu, dst, src, (size_t)bytes, kind, e, sizeof e);
    if (rc) pt_fail(err, errlen, rc, "memcpy: %s", e);
    return rc;
}

int pt_rt_stats(pt_rt *rt, pt_stats_v1 *out) {
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->gpu, &u);
    pt_stats_v1 s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.dev_capacity = u.capacity;
    s.dev_current = u.current;
    s.dev_peak = u.peak;
    s.pinned_current = u.pinned_current;
    s.pinned_arena = u.pinned_arena;
    s.pinned_own_allocs = u.pinned_own_allocs;
    s.h2d_bytes = u.h2d_bytes;
    s.d2h_bytes = u.d2h_bytes;
    s.last_grad_norm = rt->opt.last_norm;
    s.steps = rt->opt.t;
    s.pred_peak = rt->pred_peak;
    s.pred_iter_s = rt->pred_iter_s;
    pt_store_stats(rt->st, &s);
    pt_rt_ext_stats(rt, &s);
    uint32_t n = out->struct_size && out->struct_size < sizeof s ? out->struct_size : sizeof s;
    memcpy(out, &s, n);
    out->struct_size = n;
    return PT_OK;
}

int pt_rt_read_param(pt_rt *rt, int32_t index, void *dst, uint64_t bytes, char *err,
                     size_t errlen) {
    int rc = need_store(rt, "read_param", 0, err, errlen);
    const pt_rt_ext *x = rc ? NULL : pt_rt_ext_reader(rt);
    if (x) return x->read_param(rt, index, dst, bytes, err, errlen);
    return rc ? rc : pt_store_read_param(rt->st, index, dst, bytes, err, errlen);
}

int pt_rt_launch(pt_rt *rt, void (*fn)(void *), void *arg, char *err, size_t errlen) {
    if (!fn) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "launch: fn is NULL");
    const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
    void *impl = pt_gpu_impl(rt->gpu);
    const pt_rt_ext *x = rt->launch_queued ? pt_rt_ext_launcher(rt) : NULL;
    if (x) return x->launch(rt, fn, arg, err, errlen);
    if (rt->launch_queued) {
        if (ops->host_fn(impl, rt->s_compute, fn, arg))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "launch: queueing work on the compute stream failed: host_fn failed");
        return PT_OK;
    }
    /* cuda: fn enqueues its kernels on the compute stream, behind the plugin's
     * waits; nothing to wait for here */
    if (rt->host_async && strcmp(pt_gpu_backend_name(rt->gpu), "host")) {
        fn(arg);
        return PT_OK;
    }
    /* synchronous: what the stream holds (uploads the hooks ordered) runs first */
    int rc = pt_rt_stream_sync(rt, err, errlen);
    if (rc) return rc;
    fn(arg);
    return PT_OK;
}

int pt_rt_stream_sync(pt_rt *rt, char *err, size_t errlen) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
    if (ops->stream_sync(pt_gpu_impl(rt->gpu), rt->s_compute))
        return pt_fail(err, errlen, PT_ERR_BACKEND, "stream_sync: the compute stream failed");
    return pt_rt_ext_async_status(rt, err, errlen);
}
