/*
 * rt_replan.c — replan (protrain.h, ABI 1.6): profile and plan again for
 * another batch shape between steps. The store is rebuilt under the bootstrap
 * plan (what fits if anything does), the caller runs the profiling passes
 * through the host's profile_step (plugin.c's profile, the same as at
 * post_model_load), and the search rebuilds under the new plan. Parameter
 * values and optimizer state cross both rebuilds in a state image. When any
 * of it fails (the larger activations do not fit, no plan fits), the old
 * shape, trace and plan come back, built from the same image: the host can
 * go on with batches the old plan holds.
 */
#include "rt.h"

#include <stdlib.h>
#include <string.h>

#include "planner/planner.h"
#include "rt_internal.h"

/* The store rebuilt under rt->plan.kn from img (and the optimizer's state when
 * it existed). */
static int build_from(pt_rt *rt, const pt_state_image *img, char *err, size_t errlen) {
    int rc = pt_rt_build(rt, 1, err, errlen);
    if (!rc && img->has_opt) rc = pt_store_optimizer_init(rt->st, err, errlen);
    if (!rc) rc = pt_store_restore(rt->st, img, err, errlen);
    return rc;
}

/* The plan's predictions and swap windows, kept across a failed re-plan. */
typedef struct kept_plan {
    uint64_t peak;
    double iter_s, fwd_s, bwd_s, opt_s, coll[3];
    int32_t *swap_done;
} kept_plan;

static int keep_plan(const pt_rt *rt, kept_plan *k, char *err, size_t errlen) {
    *k = (kept_plan){rt->plan.pred_peak, rt->plan.pred_iter_s, rt->plan.pred_fwd_s, rt->plan.pred_bwd_s,
                     rt->plan.pred_opt_s, {rt->plan.pred_coll[0], rt->plan.pred_coll[1], rt->plan.pred_coll[2]},
                     NULL};
    if (!rt->plan.swap_done) return PT_OK;
    size_t n = (size_t)(rt->n_blocks > 0 ? rt->n_blocks : 1) * sizeof *k->swap_done;
    if (!(k->swap_done = malloc(n))) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    memcpy(k->swap_done, rt->plan.swap_done, n);
    return PT_OK;
}

static void put_plan(pt_rt *rt, kept_plan *k) {
    rt->plan.pred_peak = k->peak;
    rt->plan.pred_iter_s = k->iter_s;
    rt->plan.pred_fwd_s = k->fwd_s;
    rt->plan.pred_bwd_s = k->bwd_s;
    rt->plan.pred_opt_s = k->opt_s;
    memcpy(rt->plan.pred_coll, k->coll, sizeof k->coll);
    free(rt->plan.swap_done);
    rt->plan.swap_done = k->swap_done;
    k->swap_done = NULL;
}

static void set_shape(pt_rt *rt, int64_t batch, int64_t seq) {
    rt->hmodel->batch = rt->model->batch = batch;
    rt->hmodel->seq = rt->model->seq = seq;
}

int pt_rt_replan(pt_rt *rt, int64_t batch, int64_t seq, pt_rt_profile_fn profile, void *user,
                 char *err, size_t errlen) {
    if (batch < 1 || seq < 1)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "replan: batch %lld x sequence %lld; both must be >= 1", (long long)batch,
                       (long long)seq);
    int rc = pt_rt_need_store(rt, "replan", 0, err, errlen);
    if (rc) return rc;
    if (rt->broken)
        return pt_fail(err, errlen, rt->broken, "replan: the plugin lost its state in a failed "
                       "re-plan (see the log)");
    if (rt->dist.coll)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "replan with %d ranks: every rank would have to profile the same shape "
                       "at the same step, which the plugin cannot agree on yet; one rank only",
                       pt_coll_world(rt->dist.coll));
    int64_t ob = rt->hmodel->batch, os = rt->hmodel->seq;
    if (!pt_rt_wants_profile(rt)) {
        /* the INI's knobs run as given: nothing measured, nothing to plan */
        set_shape(rt, batch, seq);
        PT_LOGI(&rt->lg, "replan: batch %lld x sequence %lld recorded; no profiling with "
                "auto_memory = false or force_all_persistent", (long long)batch, (long long)seq);
        return PT_OK;
    }
    kept_plan kp;
    if ((rc = keep_plan(rt, &kp, err, errlen))) return rc;
    pt_state_image img;
    if ((rc = pt_store_snapshot(rt->st, &img, err, errlen))) {
        free(kp.swap_done);
        return rc;
    }
    pt_store_knobs okn = rt->plan.kn;
    int oswap = rt->plan.swap_interval;
    pt_trace old;
    pt_trace_init(&old);
    int had_trace = rt->plan.trace != NULL;
    if (had_trace && (rc = pt_trace_copy(&old, rt->plan.trace, err, errlen))) {
        pt_store_image_free(&img);
        free(kp.swap_done);
        return rc;
    }
    PT_LOGI(&rt->lg, "replan: profiling batch %lld x sequence %lld (the plan was made for "
            "%lld x %lld)", (long long)batch, (long long)seq, (long long)ob, (long long)os);
    set_shape(rt, batch, seq);
    rt->plan.kn.n_persist = 0;
    rt->plan.kn.n_buffer = -1;
    rt->plan.kn.n_swap = 0;
    rt->plan.kn.n_checkpoint = rt->n_blocks;
    rt->plan.kn.source = "bootstrap";
    rc = build_from(rt, &img, err, errlen);
    rt->prof_hook = "profiling the new shape";
    if (!rc) rc = profile(user);
    rt->prof_hook = NULL;
    if (rc) {
        /* back to the old shape and plan: the sentence above stays the error */
        char e2[512];
        set_shape(rt, ob, os);
        rt->plan.kn = okn;
        rt->plan.swap_interval = oswap;
        put_plan(rt, &kp);
        if (had_trace) (void)pt_trace_copy(rt->plan.trace, &old, NULL, 0);
        int rc2 = build_from(rt, &img, e2, sizeof e2);
        if (rc2) {
            rt->broken = rc2;
            PT_LOGE(&rt->lg, "replan: restoring the old plan failed: %s", e2);
        } else {
            rt->broken = 0;
            PT_LOGW(&rt->lg, "replan for batch %lld x sequence %lld failed; the plan for %lld x "
                    "%lld stays", (long long)batch, (long long)seq, (long long)ob, (long long)os);
        }
    }
    free(kp.swap_done);
    pt_trace_free(&old);
    pt_store_image_free(&img);
    return rc;
}
