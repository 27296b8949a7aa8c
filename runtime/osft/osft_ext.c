/*
 * osft_ext.c — OSFT as an extension of the runtime object: the points where
 * rt.c calls it (core/rt_internal.h, pt_rt_ext), each one of osft.h's
 * functions, so that the runtime names no OSFT function.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/rt_internal.h"
#include "device_ext.h"
#include "osft.h"

static int active(const pt_rt *rt) { return pt_rt_ext_state(rt, &pt_osft_ext) != NULL; }

static const char *refuse(const pt_config *cfg) {
    if (cfg->osft_enabled && cfg->tiled_mlp_enabled)
        return "[osft] enabled with [tiled_mlp] enabled: TiledMLP's per-tile gradient "
               "accumulator does not know the OSFT factors yet; enable one of them";
    if (cfg->tp_size > 1 && cfg->osft_enabled)
        return "[dist] tp_size > 1 with [osft] enabled: OSFT's factors are not split over a "
               "tensor-parallel group yet; set tp_size = 1 or disable OSFT";
    return NULL;
}

/* the ratio as text that reads back to the same bits (NaN: "auto"), as the
 * agreement writes every float */
static void agree_keys(const pt_config *c, const pt_rt_keys *k) {
    char v[64];
    snprintf(v, sizeof v, "%d", c->osft_enabled);
    k->put(k->t, "osft.enabled", v);
    if (isnan(c->osft_urr)) snprintf(v, sizeof v, "auto");
    else snprintf(v, sizeof v, "%.9g", (double)c->osft_urr);
    k->put(k->t, "osft.unfreeze_rank_ratio", v);
    k->put(k->t, "osft.targets", c->osft_targets);
    snprintf(v, sizeof v, "%d", c->osft_cache_frozen);
    k->put(k->t, "osft.cache_frozen", v);
}

/* the factors replace the targets, so a profile with OSFT measures another list */
static uint64_t cache_key(const pt_config *c, uint64_t h) {
    struct {
        int32_t on;
        float ratio;
    } in;
    memset(&in, 0, sizeof in);
    in.on = c->osft_enabled;
    in.ratio = c->osft_urr;
    h = pt_rt_key_mix(h, &in, sizeof in);
    return pt_rt_key_mix(h, c->osft_targets, strlen(c->osft_targets));
}

static int model_load(pt_rt *rt, pt_model_v1 *host, char *err, size_t errlen) {
    if (rt->cfg.osft_enabled && !pt_gpu_has_linalg(pt_gpu_ops(rt->dev.gpu)))
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "[osft] enabled, but the %s backend "
                       "library has no gemm_f32 / svd_f32 (built before OSFT): rebuild it",
                       pt_gpu_backend_name(rt->dev.gpu));
    /* the store lays out the factors in place of the targets */
    return pt_osft_setup(rt, host, err, errlen);
}

static int optimizer_check(const pt_rt *rt, int type, char *err, size_t errlen) {
    if (type == PT_OPTIM_REKLS && pt_osft_count(rt) > 0)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "create_optimizer: REKLS together with OSFT is not built (REKLS would step "
                       "OSFT's trainable factors in its own eigenbasis, which the OSFT projections "
                       "were not checked against): use adamw with [osft], or disable [osft]");
    return PT_OK;
}

/* the block's factor gradients leave the complement of the frozen bases
 * nowhere: projected on the device, queued behind the block's backward and
 * before the store copies, reduces or offloads them */
static int block_backward(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    return pt_osft_project_grads(rt, b, err, errlen);
}

/* Adam of a projected gradient leaves the subspace: the stepped values are
 * projected back wherever they were stepped */
static int after_optimizer_step(pt_rt *rt, char *err, size_t errlen) {
    return pt_osft_project_params(rt, err, errlen);
}

/* the loaded frozen factors are gathered afresh */
static void state_loaded(pt_rt *rt) { pt_osft_drop_frozen(rt); }

static void stats(const pt_rt *rt, pt_stats_v1 *s) {
    /* before post_model_load: 1 when OSFT is configured (the count comes with the model) */
    s->osft_targets = rt->hmodel ? (uint64_t)pt_osft_count(rt) : (uint64_t)(rt->cfg.osft_enabled != 0);
}

/* OSFT's share of the model states in the plan: the factors replace the dense
 * weights (Adam keeps two fp32 moments of the trainable ones) */
static void plan_log(const pt_rt *rt) {
    if (!active(rt)) return;
    uint64_t fz, tr, dn;
    pt_osft_bytes(rt, &fz, &tr, &dn);
    PT_LOGI(&rt->lg, "  osft             %d targets: factors %.3f GiB frozen + %.3f GiB "
                     "trainable (+ %.3f GiB Adam moments) in place of %.3f GiB dense",
            pt_osft_count(rt), fz / 1073741824.0, tr / 1073741824.0,
            2.0 * tr / 1073741824.0, dn / 1073741824.0);
}

const pt_rt_ext pt_osft_ext = {
    .name = "osft",
    .active = active,
    .refuse = refuse,
    .agree_keys = agree_keys,
    .cache_key = cache_key,
    .model_load = model_load,
    .model_unload = pt_osft_free,
    .optimizer_check = optimizer_check,
    .after_hook = pt_osft_mirror,
    .async_status = pt_osft_async_status,
    .block_backward = block_backward,
    .after_optimizer_step = after_optimizer_step,
    .chunk_stepped = pt_osft_chunk_stepped,
    .state_loaded = state_loaded,
    .read_param = pt_osft_read_param,
    .launch = pt_osft_launch,
    .stats = stats,
    .plan_log = plan_log,
};
