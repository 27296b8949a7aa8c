/*
 * calib.c — calibration: after a few hot steps under a plan, the measured
 * device peak and step time against the plan's prediction, and what follows
 * from them.
 *
 * Steps after the plan took effect are numbered k = 0, 1, ... (post_step
 * order). Step 0 is a warm-up (first uploads, first pinned swap buffers);
 * steps 1..MEASURE are measured: the wall time between post_steps (the
 * iteration), and on the device's clock, with timing events on the compute
 * stream, three phases of each single-micro-batch step:
 *   forward   pre_step .. block_pre_backward(last block)
 *   backward  .. optimizer_step
 *   optimizer optimizer_step .. post_step
 * At the end of step MEASURE:
 *  - peak under-predicted (the device range the run needed, its peak bytes or
 *    the allocator's high water when holes left that higher, above the
 *    prediction): the ratio measured/predicted is folded into the trace's
 *    calib.peak (the cost model's fragmentation factor is the profile's measured
 *    one times it) and the plan is searched again;
 *  - otherwise ([protrain] time_calibration), the median iteration more than
 *    TIME_LEARN (5%) away from the prediction: each phase's measured/predicted
 *    median is folded into calib.fwd/bwd/opt, which scale the profile's
 *    compute times and optimizer rates (pt_trace_calibrated). When the miss is
 *    also above [protrain] time_replan_tolerance (15%) and TIME_MIN_GAIN_S per
 *    iteration, the plan is searched again now, at most MAX_TIME_REPLANS times
 *    per run, so a model that cannot fit the machine does not re-plan forever.
 *    A smaller miss is not worth rebuilding a running job's store for, but
 *    the factors are still learned: the next run plans with them;
 *  - whatever was learned is written back into the profile cache with the
 *    profile, so the next run plans with it from its first step.
 * The factors scale compute only, and are chosen so that the phase's predicted
 * compute plus its predicted non-compute part (exposed copies, waits) equals
 * the measurement; a copy misprediction therefore lands in the compute factor
 * (what the log shows).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "device_ext.h"
#include "planner/planner.h"
#include "rt_internal.h"

enum { WARM = 1, MEASURE = 5, MAX_TIME_REPLANS = 2 };
/* a time miss above this fraction is learned (stored for the next run) even
 * when it is below the re-plan tolerance: the model's own target is 5% */
#define TIME_LEARN 0.05
/* ... and at least this many seconds per iteration: below it a re-plan (a
 * rebuild of the store) costs more than it could save, and sub-millisecond
 * steps are mostly timer and scheduling noise */
#define TIME_MIN_GAIN_S 0.002


/* The step about to run (or running) is measured: its post_step is k in 1..MEASURE. */
static int measuring(const pt_rt *rt) {
    return rt->plan.pred_peak && !rt->plan.prof && rt->cal.calib_steps >= WARM + 1 &&
           rt->cal.calib_steps <= WARM + MEASURE && rt->sx && !rt->sx->eval && rt->sx->n_micro == 1;
}

/* A failed device op while marking or reading a phase is an error of the hook
 * that ran it, like any other device op of the step (the device is not to be
 * trusted after it), not a silently skipped sample. */
int pt_rt_calib_mark(pt_rt *rt, int which, const char *hook, char *err, size_t errlen) {
    if (!measuring(rt)) return PT_OK;
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    void *impl = pt_gpu_impl(rt->dev.gpu);
    if (which == PT_CAL_PRE) rt->cal.cal_seen = 0;
    else if (rt->cal.cal_seen != (1u << which) - 1u) return PT_OK;   /* marks out of order: no sample */
    if (!rt->cal.cal_ev[which] && pt_gpu_event_create_timing(rt->dev.gpu, &rt->cal.cal_ev[which])) {
        rt->cal.cal_ev[which] = NULL;
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "%s: calibration: event_create of a timing event failed", hook);
    }
    if (ops->event_record(impl, rt->cal.cal_ev[which], rt->dev.s_compute))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "%s: calibration: event_record of a phase edge on the compute stream failed",
                       hook);
    rt->cal.cal_seen |= 1u << which;
    return PT_OK;
}

/* After PT_CAL_END of a measured step: its three phases, or nothing when a mark
 * was missing (marks out of order). */
static int take_sample(pt_rt *rt, int i, char *err, size_t errlen) {
    rt->cal.cal_ok[i] = 0;
    if (rt->cal.cal_seen != (1u << PT_CAL_N) - 1u) return PT_OK;
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    void *impl = pt_gpu_impl(rt->dev.gpu);
    /* optimizer_step has waited for the step's compute already: this is short */
    if (ops->event_sync(impl, rt->cal.cal_ev[PT_CAL_END]))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "post_step: calibration: event_sync on the step's last phase edge failed");
    for (int p = 0; p < 3; p++) {
        float ms = 0;
        if (ops->event_elapsed_ms(impl, rt->cal.cal_ev[p], rt->cal.cal_ev[p + 1], &ms))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "post_step: calibration: event_elapsed_ms between phase edges failed");
        rt->cal.cal_ph[i][p] = ms * 1e-3;
    }
    rt->cal.cal_ok[i] = 1;
    return PT_OK;
}

void pt_rt_calib_free(pt_rt *rt) {
    if (!rt->dev.gpu) return;
    for (int i = 0; i < PT_CAL_N; i++)
        if (rt->cal.cal_ev[i]) pt_gpu_ops(rt->dev.gpu)->event_destroy(pt_gpu_impl(rt->dev.gpu), rt->cal.cal_ev[i]);
    memset(rt->cal.cal_ev, 0, sizeof rt->cal.cal_ev);
}

static void store_learned(pt_rt *rt) {
    if (!rt->cfg.cache_dir[0] || !rt->plan.trace) return;
    char e2[512];
    if (pt_trace_cache_store(rt->cfg.cache_dir, rt->plan.trace, e2, sizeof e2))
        PT_LOGW(&rt->lg, "profile cache: the calibration was not stored: %s", e2);
    else
        PT_LOGI(&rt->lg, "profile cache: stored the calibration (peak x%.4f, forward x%.3f, "
                         "backward x%.3f, optimizer x%.3f) with the profile",
                rt->plan.trace->calib.peak > 0 ? rt->plan.trace->calib.peak : 1.0,
                rt->plan.trace->calib.fwd > 0 ? rt->plan.trace->calib.fwd : 1.0,
                rt->plan.trace->calib.bwd > 0 ? rt->plan.trace->calib.bwd : 1.0,
                rt->plan.trace->calib.opt > 0 ? rt->plan.trace->calib.opt : 1.0);
}

static void replan(pt_rt *rt) {
    char err[512];
    int rc = pt_rt_search_and_apply(rt, rt->plan.trace, 0.0, err, sizeof err);
    if (rc) {
        PT_LOGE(&rt->lg, "calibration re-plan failed: %s", err);
        rt->broken = rc;
    }
}

static double fold(double old, double f) { return (old > 0 ? old : 1.0) * f; }
static double one(double f) { return f > 0 ? f : 1.0; }

/* The profile's compute in each phase, as the plan in force predicted it
 * (calibration applied). */
static void phase_compute(const pt_trace *t, double *cf, double *cb) {
    pt_trace_phase_compute(t, cf, cb);
    *cf *= one(t->calib.fwd);
    *cb *= one(t->calib.bwd);
}

/* The factor that makes the phase's prediction equal the measurement when only
 * its compute share (c of the predicted p) is wrong: (m - (p - c)) / c. When the
 * measurement is below the non-compute share (copies over-predicted) or there is
 * no compute share, the whole-phase ratio m / p. */
static double phase_factor(double m, double p, double c) {
    if (!(p > 0) || !(m > 0)) return 1.0;
    double x = p - c;
    if (c > 0 && m > x) return (m - x) / c;
    return m / p;
}

/* Time: returns 1 when it learned factors (and planned again if the miss was
 * large enough). */
static int time_calibrate(pt_rt *rt) {
    double ratio = rt->plan.pred_iter_s > 0 ? rt->cal.meas_iter_s / rt->plan.pred_iter_s : 1.0;
    double tol = rt->cfg.time_replan_tolerance > 0 ? rt->cfg.time_replan_tolerance : 0.15;
    double learn = tol < TIME_LEARN ? tol : TIME_LEARN;
    if (fabs(ratio - 1.0) <= learn || !rt->plan.trace) return 0;
    int now = fabs(ratio - 1.0) > tol && fabs(rt->cal.meas_iter_s - rt->plan.pred_iter_s) >= TIME_MIN_GAIN_S;
    double ph[3][MEASURE];
    int n = 0;
    for (int i = 0; i < MEASURE; i++) {
        if (!rt->cal.cal_ok[i]) continue;
        for (int p = 0; p < 3; p++) ph[p][n] = rt->cal.cal_ph[i][p];
        n++;
    }
    if (n < MEASURE / 2 + 1) {
        PT_LOGI(&rt->lg, "calibration: the iteration is x%.3f the prediction, but only %d of %d "
                         "steps had their phases timed (micro-batches > 1, or evaluation passes "
                         "in between): the plan stays", ratio, n, MEASURE);
        return 0;
    }
    if (now && rt->cal.time_replans >= MAX_TIME_REPLANS) {
        PT_LOGW(&rt->lg, "calibration: the iteration is still x%.3f the prediction after %d "
                         "time re-plans: the plan stays", ratio, rt->cal.time_replans);
        return 0;
    }
    double mf = pt_median(ph[0], n), mb = pt_median(ph[1], n), mo = pt_median(ph[2], n);
    double cf, cb;
    phase_compute(rt->plan.trace, &cf, &cb);
    double ff = phase_factor(mf, rt->plan.pred_fwd_s, cf);
    double fb = phase_factor(mb, rt->plan.pred_bwd_s, cb);
    /* a tail under 0.1 ms on either side is noise, not a rate */
    double fo = rt->plan.pred_opt_s > 1e-4 && mo > 1e-4 ? mo / rt->plan.pred_opt_s : 1.0;
    pt_trace_calib *c = &rt->plan.trace->calib;
    c->fwd = fold(c->fwd, ff);
    c->bwd = fold(c->bwd, fb);
    c->opt = fold(c->opt, fo);
    if (!now) {
        PT_LOGI(&rt->lg, "calibration: the iteration is x%.3f the prediction (within the re-plan "
                         "tolerance %.0f%%, beyond %.0f%%); phases on the device clock: forward "
                         "x%.3f, backward x%.3f, optimizer x%.3f; the plan stays, and the profile's "
                         "times scaled by forward x%.3f, backward x%.3f, optimizer x%.3f are kept "
                         "for the next run", ratio, tol * 100, learn * 100, ff, fb, fo, c->fwd,
                c->bwd, c->opt);
        return 1;
    }
    rt->cal.time_replans++;
    double old_meas = rt->cal.meas_iter_s;
    uint64_t old_pred = rt->plan.pred_peak;
    PT_LOGI(&rt->lg, "calibration: the iteration is x%.3f the prediction (more than %.0f%% off); "
                     "phases on the device clock: forward %.4f s vs %.4f (x%.3f), backward %.4f "
                     "vs %.4f (x%.3f), optimizer %.4f vs %.4f (x%.3f); planning again with the "
                     "profile's times scaled by forward x%.3f, backward x%.3f, optimizer x%.3f",
            ratio, tol * 100, mf, rt->plan.pred_fwd_s, ff, mb, rt->plan.pred_bwd_s, fb, mo,
            rt->plan.pred_opt_s, fo, c->fwd, c->bwd, c->opt);
    replan(rt);
    if (rt->broken) return 1;
    PT_LOGI(&rt->lg, "calibration: the new plan predicts %.4f s per iteration (%.4f s "
                     "measured under the old one)", rt->plan.pred_iter_s, old_meas);
    if (rt->plan.tl && rt->plan.tl->n && rt->plan.pred_peak == old_pred) {
        /* time factors do not move memory: the same predicted peak is the same
         * picture, and the peak measured under the old plan still belongs on it */
        char terr[512];
        if (pt_timeline_write_file(rt->plan.tl, NULL, rt->cal.meas_peak, rt->cfg.timeline_file, terr,
                                   sizeof terr))
            PT_LOGW(&rt->lg, "calibration: %s", terr);
    }
    return 1;
}

/* At the end of step WARM + MEASURE under a plan: the comparison and what
 * follows from it (see the top of the file). Failures here are the re-plan's
 * (rt->broken) or logged. */
static void decide(pt_rt *rt, int k) {
    if (k == WARM) pt_store_coll_seconds(rt->st, rt->cal.coll0);
    if (k != WARM + MEASURE || !rt->plan.pred_peak) return;
    if (rt->dist.coll) {
        double c1[3];
        pt_store_coll_seconds(rt->st, c1);
        PT_LOGI(&rt->lg, "calibration: collectives per iteration, measured vs predicted: "
                         "all-reduce %.6f s vs %.6f s, all-gather %.6f s vs %.6f s, "
                         "reduce-scatter %.6f s vs %.6f s",
                (c1[0] - rt->cal.coll0[0]) / MEASURE, rt->plan.pred_coll[0],
                (c1[1] - rt->cal.coll0[1]) / MEASURE, rt->plan.pred_coll[1],
                (c1[2] - rt->cal.coll0[2]) / MEASURE, rt->plan.pred_coll[2]);
    }
    double dt[MEASURE];
    for (int i = 0; i < MEASURE; i++) dt[i] = rt->cal.calib_t[WARM + i + 1] - rt->cal.calib_t[WARM + i];
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    rt->cal.meas_peak = u.peak;
    rt->cal.meas_iter_s = pt_median(dt, MEASURE);
    double pr = (double)u.peak / (double)rt->plan.pred_peak;
    PT_LOGI(&rt->lg, "calibration: measured peak %llu bytes (%.2f MiB, allocator fragmentation "
                     "x%.4f) vs predicted %llu (x%.4f); median iteration %.4f s vs predicted "
                     "%.4f s (x%.3f)",
            (unsigned long long)u.peak, u.peak / 1048576.0, pt_gpu_frag_factor(&u),
            (unsigned long long)rt->plan.pred_peak, pr, rt->cal.meas_iter_s, rt->plan.pred_iter_s,
            rt->plan.pred_iter_s > 0 ? rt->cal.meas_iter_s / rt->plan.pred_iter_s : 0.0);
    if (rt->plan.tl && rt->plan.tl->n) {
        /* the picture of the plan that ran, now with what it really peaked at
         * (a re-plan below then writes its own prediction over it) */
        char terr[512];
        if (pt_timeline_write_file(rt->plan.tl, NULL, u.peak, rt->cfg.timeline_file, terr, sizeof terr))
            PT_LOGW(&rt->lg, "calibration: %s", terr);
    }
    if (!rt->plan.trace) return;
    /* What the plan must cover is the device range the run needed: its peak
     * bytes, or the allocator's high water when holes left it higher (the
     * prediction promises that much capacity, fragmentation included). */
    uint64_t need = u.span_peak > u.peak ? u.span_peak : u.peak;
    int under = need > rt->plan.pred_peak;
    if (rt->dist.coll) {
        /* a re-plan exchanges the plan (and in mode C rebuilds through
         * collectives): all ranks or none, so any rank's under-prediction re-plans
         * every rank */
        double f = under;
        char e[512];
        if (pt_coll_allreduce(rt->dist.coll, &f, 1, PT_COLL_F64, 1.0, "the calibration decision", e,
                              sizeof e)) {
            PT_LOGE(&rt->lg, "calibration: %s", e);
            rt->broken = PT_ERR_BACKEND;
            return;
        }
        under = f > 0;
    }
    if (under) {
        /* Under-predicted: plan again with the measured correction, carrying the
         * parameters and optimizer state across (the state image is per parameter). */
        if (need > rt->plan.pred_peak) {
            rt->plan.trace->calib.peak = fold(rt->plan.trace->calib.peak, (double)need / (double)rt->plan.pred_peak);
            PT_LOGW(&rt->lg, "calibration: the peak was under-predicted by %llu bytes (device "
                             "range %llu of which %llu in use); planning again with peak "
                             "correction x%.4f on top of the profile's measured fragmentation "
                             "x%.4f", (unsigned long long)(need - rt->plan.pred_peak),
                    (unsigned long long)need, (unsigned long long)u.peak, rt->plan.trace->calib.peak,
                    rt->plan.trace->frag.factor >= 1.0 ? rt->plan.trace->frag.factor : 1.0);
        } else {
            PT_LOGW(&rt->lg, "calibration: another rank's peak was under-predicted; planning "
                             "again with it");
        }
        replan(rt);
        store_learned(rt);
        rt->cal.calib_steps = WARM + MEASURE + 1;   /* measure once per plan */
        return;
    }
    if (rt->dist.coll) {
        /* each rank would decide on its own timings, and a re-plan must happen on
         * every rank or none */
        if (rt->cfg.time_calibration)
            PT_LOGI(&rt->lg, "calibration: no time re-plan with several ranks");
        return;
    }
    if (rt->cfg.time_calibration && time_calibrate(rt)) store_learned(rt);
}

int pt_rt_calibrate(pt_rt *rt, char *err, size_t errlen) {
    int k = rt->cal.calib_steps++;
    if (k < (int)(sizeof rt->cal.calib_t / sizeof rt->cal.calib_t[0])) rt->cal.calib_t[k] = pt_now_s();
    int rc = k >= WARM + 1 && k <= WARM + MEASURE ? take_sample(rt, k - WARM - 1, err, errlen) : PT_OK;
    rt->cal.cal_seen = 0;
    if (rc) return rc;
    decide(rt, k);
    return PT_OK;
}
