/*
 * rt.c — the runtime context: created from the configuration and the host's
 * table (device, streams, collectives, tensor-parallel groups, ordering), and
 * destroyed with an account of what leaked. The store is built in rt_build.c,
 * the optimizer set up in rt_optim.c, the hooks in rt_hooks.c and the host's
 * device services in rt_mem.c.
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

static void gpu_log(void *user, int32_t level, const char *msg) {
    pt_log(&((pt_rt *)user)->lg, level, "%s", msg);
}

/* Tensor parallel of size P inside data parallel: groups of P consecutive
 * ranks (group rank = rank % P holds shard rank % P of every split param), and
 * the world / P ranks that hold the same shard, one per group, across which
 * gradients are averaged (none when world == P). */
static int tp_groups(pt_rt *rt, int P, char *err, size_t errlen) {
    int r = pt_coll_rank(rt->dist.coll), W = pt_coll_world(rt->dist.coll);
    int rc = pt_coll_split(rt->dist.coll, r / P, r, &rt->dist.tp_coll, err, errlen);
    if (!rc && W > P) rc = pt_coll_split(rt->dist.coll, r % P, r, &rt->dist.dp_coll, err, errlen);
    if (!rc)
        PT_LOGI(&rt->lg, "tensor-parallel group %d of %d (ranks %d..%d, this rank %d in it); "
                "gradients averaged over %d replica(s)", r / P, W / P, r / P * P,
                r / P * P + P - 1, r % P, W / P);
    return rc;
}

/* Configured features this build does not have, as a sentence (NULL: none). */
static const char *unbuilt(const pt_config *cfg, const pt_host_v1 *host) {
    /* the features' own (which combine, and with tensor parallelism) first */
    const char *missing = pt_rt_ext_refuse(cfg);
    if (missing) return missing;
    if (host && host->world_size > 1 && !strcmp(cfg->dist_backend, "none"))
        missing = "[dist] backend = none with world_size > 1: the ranks could not agree on "
                  "gradients";
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
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    void *impl = pt_gpu_impl(rt->dev.gpu);
    int rc;
    if (host && host->compute_stream) {
        if ((rc = pt_gpu_adopt_stream(rt->dev.gpu, host->compute_stream, &rt->dev.s_compute, err,
                                      errlen)))
            return rc;
        rt->dev.adopted_compute = 1;
    } else if ((rc = ops->stream_create(impl, &rt->dev.s_compute))) {
        rt->dev.s_compute = NULL;
    }
    if (rc || !rt->dev.s_compute || (rc = ops->stream_create(impl, &rt->dev.s_h2d)) ||
        (rc = ops->stream_create(impl, &rt->dev.s_d2h)))
        return pt_fail(err, errlen, PT_ERR_BACKEND, "cannot create device streams on the %s backend",
                       pt_gpu_backend_name(rt->dev.gpu));
    return PT_OK;
}

/* How the plugin's work is ordered after the host's (PT_HOST_ASYNC_COMPUTE). */
static void set_ordering(pt_rt *rt, const pt_config *cfg, const pt_host_v1 *host) {
    rt->dev.host_async = host && (host->flags & PT_HOST_ASYNC_COMPUTE);
    rt->dev.launch_queued = rt->dev.host_async && cfg->async_compute &&
                        !strcmp(pt_gpu_backend_name(rt->dev.gpu), "host");
    rt->dev.ordered = rt->dev.host_async;
    rt->dev.skip = (unsigned)cfg->debug_skip_ordering;
    if (rt->dev.host_async && rt->dev.skip)
        PT_LOGW(&rt->lg, "[testing] debug_skip_ordering = %u: the plugin skips some of its "
                         "ordering after the host's compute (a testing aid: training is wrong)",
                rt->dev.skip);
}

/* Several ranks: the collectives, and the tensor-parallel groups. */
static int open_dist(pt_rt *rt, const pt_config *cfg, const pt_host_v1 *host, char *err,
                     size_t errlen) {
    /* the transport follows the device backend actually opened (auto may
     * have fallen back to host): nccl on cuda, mpi on host, or the host's own
     * collectives when it hands them (rt->host holds NULL past its struct_size) */
    const char *tr = NULL;
    const char *dev = pt_gpu_backend_name(rt->dev.gpu);
    const pt_host_coll_v1 *table = rt->host.coll;
    int rc = pt_coll_pick_table(cfg->dist_backend, dev, cfg->init_method, table != NULL, &tr,
                                err, errlen);
    if (rc) return rc;
    if (cfg->tp_size > 1 && strcmp(tr, "mpi"))
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "[dist] tp_size > 1 runs on the "
                       "host backend's mpi transport only (config %s)", cfg->source);
    pt_coll_config cc = {host->world_size, host->rank, cfg->init_method,
                         (double)cfg->dist_timeout, cfg->debug_hang_rank, tr,
                         host->device_index, NULL, table};
    if ((rc = pt_coll_open(&cc, &rt->dist.coll, err, errlen)) || (rc = pt_agree_init(rt, err, errlen)))
        return rc;
    if (cfg->tp_size > 1 && (rc = tp_groups(rt, cfg->tp_size, err, errlen))) return rc;
    if (table)
        PT_LOGI(&rt->lg, "data parallel: rank %d of %d over the host's own collectives on the "
                         "%s backend (their deadline is the host's; [dist] timeout = %g s does "
                         "not apply)", host->rank, host->world_size, dev,
                (double)cfg->dist_timeout);
    else
        PT_LOGI(&rt->lg, "%s: rank %d of %d over %s on the %s backend (init_method %s, "
                         "timeout %g s)",
                cfg->tp_size > 1 ? "tensor parallel" : "data parallel", host->rank,
                host->world_size, tr, dev, cfg->init_method, (double)cfg->dist_timeout);
    return PT_OK;
}

/* A host that declares one rank although an MPI launcher started this process
 * (its variables are set): every process would train alone and write the same
 * outputs. MPI's own count is the truth, so the host's world size and rank are
 * checked against it, as for several ranks (pt_coll_open says which rank
 * declared what). [dist] backend = none opts out: independent processes under
 * one launcher, deliberately. */
static int check_solo(pt_rt *rt, const pt_config *cfg, const pt_host_v1 *host, char *err,
                      size_t errlen) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE",
                                       "PMI_RANK"};
    int launched = 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) launched |= getenv(vars[i]) != NULL;
    /* backend = host: the host's own collectives, not MPI, say who the ranks are */
    if (!launched || !strcmp(cfg->dist_backend, "none") || !strcmp(cfg->dist_backend, "host"))
        return PT_OK;
    pt_coll_config cc = {1, host ? host->rank : 0, "env", (double)cfg->dist_timeout, -1, "mpi",
                         host ? host->device_index : 0, NULL, NULL};
    int rc = pt_coll_open(&cc, &rt->solo, err, errlen);
    if (rc) {
        size_t n = strlen(err);
        snprintf(err + n, errlen > n ? errlen - n : 0, " (this process was started by an MPI "
                 "launcher; [dist] backend = none runs independent processes deliberately)");
    }
    return rc;
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
    rt->plan.plan_clip = cfg->max_grad_norm > 0;
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
    if ((rc = pt_gpu_open(kind, &gc, &rt->dev.gpu, err, errlen))) {
        free(rt);
        return rc;
    }
    if ((rc = open_streams(rt, host, err, errlen))) {
        pt_rt_destroy(rt);
        return rc;
    }
    /* the device layer's reports (leaks at close, backend failures) go to the log */
    pt_gpu_set_log(rt->dev.gpu, gpu_log, rt);
    const char *why = pt_gpu_fallback_reason(rt->dev.gpu);
    if (why && *why)
        PT_LOGW(&rt->lg, "backend = auto: the cuda backend was not used (%s); running on the "
                         "simulated host device", why);
    set_ordering(rt, cfg, host);
    if (host && host->world_size > 1) rc = open_dist(rt, cfg, host, err, errlen);
    else rc = check_solo(rt, cfg, host, err, errlen);
    if (rc) {
        pt_rt_destroy(rt);
        return rc;
    }
    char name[128];
    pt_gpu_device_name(rt->dev.gpu, name, sizeof name);
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    PT_LOGI(&rt->lg, "backend %s (%s), device capacity %.1f MiB, config %s",
            pt_gpu_backend_name(rt->dev.gpu), name, u.capacity / 1048576.0, cfg->source);
    *out = rt;
    return PT_OK;
}

size_t pt_rt_destroy(pt_rt *rt) {
    if (!rt) return 0;
    (void)pt_rt_store_free(rt, NULL, 0);   /* logged: finalize goes on */
    pt_rt_ext_unload(rt);
    pt_rt_ext_fini(rt);
    pt_rt_plan_free(rt);
    pt_coll_close(rt->dist.dp_coll);   /* sub-groups before their group */
    pt_coll_close(rt->dist.tp_coll);
    pt_coll_close(rt->dist.coll);
    rt->dist.coll = NULL;
    pt_coll_close(rt->solo);
    rt->solo = NULL;
    size_t leaked = 0;
    pt_rt_calib_free(rt);
    if (rt->dev.gpu) {
        const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
        void *impl = pt_gpu_impl(rt->dev.gpu);
        if (rt->dev.s_compute && !rt->dev.adopted_compute) ops->stream_destroy(impl, rt->dev.s_compute);
        if (rt->dev.s_h2d) ops->stream_destroy(impl, rt->dev.s_h2d);
        if (rt->dev.s_d2h) ops->stream_destroy(impl, rt->dev.s_d2h);
        leaked = pt_gpu_live_allocs(rt->dev.gpu);
        if (leaked)
            PT_LOGW(&rt->lg, "finalize: %zu device allocation(s) made through dev_alloc were "
                             "never freed by the host; reclaimed", leaked);
        pt_gpu_close(rt->dev.gpu);
    }
    free(rt);
    return leaked;
}

