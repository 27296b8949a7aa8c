/*
 * rt_hooks.c — the per-step hook entry points: each calls the chunk store's
 * work, bracketed by the profiler's window marks while profiling and the
 * calibration's phase marks, and gives the features (rt_ext.c) their turn
 * after it; also set_lr, dist_allreduce and save/load of the state.
 */
#include "rt.h"

#include <math.h>

#include "profiler.h"
#include "rt_internal.h"

/* save/load/read need the store and (save/load) the optimizer's state. */
int pt_rt_need_store(pt_rt *rt, const char *what, int need_opt, char *err, size_t errlen) {
    if (!rt->st || (need_opt && !pt_store_optimizer_ready(rt->st)))
        return pt_fail(err, errlen, PT_ERR_ORDER, "%s needs post_model_load%s first", what,
                       need_opt ? " and create_optimizer" : "");
    return PT_OK;
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
    if (rt->plan.prof) pt_prof_hook(rt, which, b, 0);
    int rc = fn(rt->st, b, err, errlen);
    if (rt->plan.prof) pt_prof_hook(rt, which, b, 1);
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

int pt_rt_clip_grad_norm(pt_rt *rt, float max_norm, double *norm, char *err, size_t errlen) {
    if (rt->broken)
        return pt_fail(err, errlen, rt->broken, "clip_grad_norm: the plugin lost its state in a "
                       "failed re-plan (see the log)");
    /* launched work wrote the gradients the norm reads */
    int rc = norm ? pt_rt_ext_async_status(rt, err, errlen) : PT_OK;
    if (!rc) rc = pt_store_clip_grad_norm(rt->st, max_norm, norm, err, errlen);
    pt_rt_ext_after_hook(rt);
    return rc;
}

int pt_rt_dist_allreduce(pt_rt *rt, double *values, int32_t n, char *err, size_t errlen) {
    if (n < 0 || (n > 0 && !values))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "dist_allreduce: values is NULL or n (%d) is negative", (int)n);
    if (!rt->dist.coll) return PT_OK;
    return pt_coll_allreduce(rt->dist.coll, values, (size_t)n, PT_COLL_F64, 1.0, "dist_allreduce",
                             err, errlen);
}

void pt_rt_dist_abort(pt_rt *rt, const char *why) {
    pt_coll_abort(rt->dist.coll, why);   /* the sub-groups share its notices */
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
    int rc = pt_rt_need_store(rt, "save_state", 1, err, errlen);
    return rc ? rc : pt_store_save(rt->st, dir, err, errlen);
}

int pt_rt_load_state(pt_rt *rt, const char *dir, char *err, size_t errlen) {
    int rc = pt_rt_need_store(rt, "load_state", 1, err, errlen);
    if (!rc) rc = pt_store_load(rt->st, dir, err, errlen);
    pt_rt_ext_state_loaded(rt);
    pt_rt_ext_after_hook(rt);
    return rc;
}
