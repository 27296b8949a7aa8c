/*
 * rt_build.c — post_model_load and the store it builds: the model checked and
 * handed to the features, the knobs of the plan in force (the INI's, or the
 * bootstrap plan that profiling runs), each block's activation mode by the
 * placement rule, and the chunk store created under them.
 */
#include "rt.h"

#include <stdlib.h>
#include <string.h>

#include "device_ext.h"
#include "planner/planner.h"
#include "profiler.h"
#include "rt_internal.h"

int pt_rt_model_load(pt_rt *rt, pt_model_v1 *model, char *err, size_t errlen) {
    if (!model || model->n_params <= 0 || !model->params || model->n_blocks < 0) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: model descriptor is empty (n_params %d, n_blocks %d)",
            model ? model->n_params : 0, model ? model->n_blocks : 0);
    }
    int rc = pt_store_validate(model, err, errlen);
    if (rc) return rc;
    pt_gpu_oom_reset(rt->dev.gpu);   /* pt_rt_explain_oom speaks of this call only */
    /* a retry after a failed post_model_load starts from nothing */
    (void)pt_rt_store_free(rt, NULL, 0);
    pt_rt_plan_free(rt);
    rt->broken = 0;
    /* the features may refuse the model or replace the list the store lays out */
    if ((rc = pt_rt_ext_model_load(rt, model, err, errlen))) return rc;
    rt->n_blocks = model->n_blocks;
    rt->plan.kn.n_persist = rt->cfg.force_all_persistent ? -1 : rt->cfg.n_persist;
    rt->plan.kn.n_buffer = rt->cfg.n_buffer;
    rt->plan.kn.n_swap = rt->cfg.n_swap;
    rt->plan.kn.n_checkpoint = rt->cfg.n_checkpoint;
    rt->plan.kn.source = rt->cfg.force_all_persistent ? "force_all_persistent" : "INI";
    /* mode C when asked for (several ranks only) */
    rt->dist.shard = rt->dist.coll && rt->cfg.zero3_shard == 1;
    if (pt_rt_wants_profile(rt)) {
        /* auto_mode may pick C after the search: profile sharded, which needs
         * the least pinned memory (the profile records the replicated figures) */
        if (pt_rt_auto_shard(rt)) rt->dist.shard = 1;
        /* bootstrap: stream every chunk through the minimal pool, checkpoint every
         * block — what fits if anything does, so profiling itself never OOMs
         * where a plan exists */
        rt->plan.kn.n_persist = 0;
        rt->plan.kn.n_buffer = -1;
        rt->plan.kn.n_swap = 0;
        rt->plan.kn.n_checkpoint = model->n_blocks;
        rt->plan.kn.source = "bootstrap";
    }
    return pt_rt_build(rt, 0, err, errlen);
}

/* Per-block activation modes from (n_swap, n_checkpoint) — INI overrides until
 * the searcher decides — by the placement rule of runtime/placement.h. The swap
 * interval comes from the profile when there is one, else 1. */
static int block_modes(pt_rt *rt, int32_t *modes, char *err, size_t errlen) {
    int n = rt->n_blocks;
    int ns = rt->plan.kn.n_swap > 0 ? rt->plan.kn.n_swap : 0;
    int nc = rt->plan.kn.n_checkpoint > 0 ? rt->plan.kn.n_checkpoint : 0;
    uint8_t *m8 = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!m8) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    int rc = pt_place_blocks(n, ns, nc, rt->plan.swap_interval > 0 ? rt->plan.swap_interval : 1, m8, err,
                             errlen);
    if (rc) {
        free(m8);
        return PT_ERR_CONFIG;
    }
    for (int b = 0; b < n; b++) modes[b] = m8[b];
    char map[512];
    pt_place_modes_string(m8, n, map, sizeof map);
    free(m8);
    PT_LOGI(&rt->lg, "activation modes (N NONE, C CKPT, S SWAP): %s", n ? map : "(no blocks)");
    return PT_OK;
}

static void store_mark(void *user, int kind, int32_t b, int after) {
    pt_rt *rt = user;
    /* the host's recompute reads its descriptors: the addresses the store's
     * gather just set must be there (OSFT keeps them in its own list) */
    if (kind == PT_STORE_MARK_RECOMPUTE && !after) pt_rt_ext_after_hook(rt);
    if (rt->plan.prof) pt_prof_store_mark(rt, kind, b, after);
}

int pt_rt_store_free(pt_rt *rt, char *err, size_t errlen) {
    int rc = pt_store_destroy(rt->st, err, errlen);
    rt->st = NULL;
    return rc;
}

/* (Re)build the store and the activation policy from rt->plan.kn; from_image: the
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
        rc = !strcmp(rt->plan.kn.source, "bootstrap")
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
                      rt->plan.kn.source);
    }
    if (!rc) {
        pt_store_env env = {&rt->cfg, &rt->lg, &rt->host, rt->dev.gpu, rt->dev.s_compute, rt->dev.s_h2d,
                            rt->dev.s_d2h, rt->model, &rt->opt, rt->sx, store_mark, rt,
                            rt->dev.ordered, rt->dev.skip, rt->dist.coll, rt->dist.shard, rt->dist.tp_coll,
                            rt->dist.dp_coll, pt_rt_ext_chunk_stepped(rt)};
        /* chunk_stepped: after an offloaded chunk's CPU step, on its worker, a
         * feature's work on the values the step changed there (OSFT's
         * projection), so nothing waits for other chunks' steps */
        rc = pt_store_create(&env, &rt->plan.kn, modes, rt->plan.swap_done, from_image, &rt->st, err,
                             errlen);
        pt_rt_ext_after_hook(rt);
    }
    free(modes);
    /* peaks from here on belong to the plan in force (not to profiling) */
    pt_gpu_reset_peak(rt->dev.gpu);
    rt->cal.calib_steps = 0;
    return rc;
}
