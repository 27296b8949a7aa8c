/*
 * rt_discard.c — discard_step (protrain.h, ABI 1.6): the step in progress is
 * dropped and the runtime is back where the last optimizer_step left it (the
 * store's side in store/discard.c). The plugin's lifecycle is reset by the
 * caller once this succeeds.
 */
#include "rt.h"

#include "rt_internal.h"

int pt_rt_discard_step(pt_rt *rt, int eval, char *err, size_t errlen) {
    if (rt->broken)
        return pt_fail(err, errlen, rt->broken, "discard_step: the plugin lost its state in a "
                       "failed re-plan (see the log)");
    /* a tile loop or a recompute calls the host from inside a hook, which
     * plugin.c refuses (a nested call); profiling is checked here too */
    if (rt->plan.prof)
        return pt_fail(err, errlen, PT_ERR_ORDER,
                       "discard_step called out of order: profiling (the host's profile_step) "
                       "is running; return from it first");
    if (rt->dist.coll && !eval)
        /* a rank that drops its gradients while the others all-reduce theirs
         * would leave the group waiting, and the ranks' weights would part */
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "discard_step with %d ranks: dropping a step needs every rank to drop "
                       "the same step, which the plugin cannot agree on yet; one rank only",
                       pt_coll_world(rt->dist.coll));
    int rc = pt_rt_need_store(rt, "discard_step", 0, err, errlen);
    if (!rc) rc = pt_store_discard(rt->st, eval, err, errlen);
    if (rc) return rc;
    /* a failure inside work the host launched belonged to the dropped step */
    char e2[256];
    if (pt_rt_ext_async_status(rt, e2, sizeof e2))
        PT_LOGW(&rt->lg, "discard_step: dropped with the step: %s", e2);
    rt->cal.cal_seen = 0;          /* the step's calibration marks: no sample */
    pt_rt_ext_after_hook(rt);  /* the host's descriptors: the windows are closed */
    return PT_OK;
}
