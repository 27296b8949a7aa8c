/*
 * plan_rt.c — planning at post_model_load: profile under the bootstrap plan
 * (or reuse a cached trace), search the four knobs, rebuild the store under
 * the chosen plan, log the plan (and write it as JSON when plan_file is set).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optim/optim.h"
#include "planner/planner.h"
#include "profiler.h"
#include "profiler_disk.h"
#include "rt_internal.h"

#include <sys/statvfs.h>


/* auto_memory: profile and plan, even when the INI fixes all four knobs (the plan
 * then checks them against the device and predicts their peak and time).
 * auto_memory = false or force_all_persistent: run the INI knobs as given. */
/* Tensor-parallel REKLS gathers each split param's weights too when its l2
 * decay is on: the created optimizer's weight_decay, or before it the INI's
 * (auto is REKLS's 0.01). */
static int tp_l2(const pt_rt *rt) {
    const pt_config *c = &rt->cfg;
    if (c->tp_size <= 1 || c->rekls_wd_method != PT_REKLS_WD_L2) return 0;
    if (rt->opt.type) return rt->opt.type == PT_OPTIM_REKLS && rt->opt.weight_decay != 0;
    return c->optim_type == PT_OPTIM_REKLS && c->weight_decay != 0;   /* NaN (auto) != 0 */
}

/* The optimizer decides the schedule (clipping defers the CPU steps past backward);
 * a plan made for the other schedule is searched again before any state exists. */
int pt_rt_replan_for_optimizer(pt_rt *rt, int clip, char *err, size_t errlen) {
    if (!rt->plan.trace || (clip == rt->plan.plan_clip && tp_l2(rt) == rt->plan.plan_tp_l2)) return PT_OK;
    if (clip != rt->plan.plan_clip)
        PT_LOGI(&rt->lg, "optimizer %s gradient clipping: planning again for the %s schedule",
                clip ? "uses" : "does not use", clip ? "clipped (CPU steps after backward)" : "overlapped");
    else
        PT_LOGI(&rt->lg, "optimizer %s REKLS's l2 weight decay: planning again %s the "
                         "tensor-parallel gathers of the split weights",
                tp_l2(rt) ? "uses" : "does not use",
                tp_l2(rt) ? "with" : "without");
    rt->plan.plan_clip = clip;
    return pt_rt_search_and_apply(rt, rt->plan.trace, 0.0, err, errlen);
}

void pt_rt_plan_free(pt_rt *rt) {
    free(rt->plan.swap_done);
    rt->plan.swap_done = NULL;
    pt_timeline_free(rt->plan.tl);
    free(rt->plan.tl);
    rt->plan.tl = NULL;
    if (rt->plan.trace) pt_trace_free(rt->plan.trace);
    free(rt->plan.trace);
    rt->plan.trace = NULL;
}

int pt_rt_auto_shard(const pt_rt *rt) {
    /* Tensor parallelism already splits its parameters over the ranks: never
     * mode C with it. (OSFT runs in mode C: its value projection gathers the
     * split factors; the cost model does not charge that gather yet. REKLS runs
     * in mode C with each param's state at one owner rank, which the cost model
     * counts: the owner bound per rank and the exchange's time.) */
    return rt->dist.coll && rt->cfg.auto_mode && rt->cfg.zero3_shard < 0 && rt->cfg.tp_size <= 1;
}

int pt_rt_wants_profile(const pt_rt *rt) {
    const pt_config *c = &rt->cfg;
    if (!c->auto_memory || c->force_all_persistent) return 0;
    return rt->host.profile_step != NULL && rt->model && rt->model->n_blocks > 0;
}

int pt_rt_profile_begin(pt_rt *rt, char *err, size_t errlen) {
    if (!rt->plan.prof) rt->plan.prof_t0 = pt_now_s();
    int rc = pt_prof_begin(rt, err, errlen);
    pt_store_set_profiling(rt->st, rt->plan.prof != NULL);
    return rc;
}

int pt_rt_profile_passes(void) { return pt_prof_passes(); }

void pt_rt_profile_abort(pt_rt *rt) {
    pt_prof_free(rt);
    if (rt->st) pt_store_set_profiling(rt->st, 0);
}

/* After the host's profile_step returned: trace -> search -> rebuild. */
int pt_rt_profile_end(pt_rt *rt, char *err, size_t errlen) {
    pt_trace t;
    int rc = pt_prof_finish(rt, &t, err, errlen);
    pt_rt_profile_abort(rt);
    if (rc) {
        pt_trace_free(&t);
        return rc;
    }
    double prof_s = pt_now_s() - rt->plan.prof_t0;
    rt->plan.swap_interval = 0;
    if (rt->cfg.cache_dir[0]) {
        char e2[512];
        if (pt_trace_cache_store(rt->cfg.cache_dir, &t, e2, sizeof e2))
            PT_LOGW(&rt->lg, "profile cache: not stored: %s", e2);
        else
            PT_LOGI(&rt->lg, "profile cache: stored in %s", rt->cfg.cache_dir);
    }
    const pt_rt_ext *se = pt_rt_ext_searcher(rt);
    rc = se ? se->search(rt, &t, prof_s, err, errlen)
            : pt_rt_search_and_apply(rt, &t, prof_s, err, errlen);
    pt_trace_free(&t);
    return rc;
}

/* Auto pinned budget: 90% of MemAvailable (same rule as the store's check). */
static uint64_t host_budget(const pt_rt *rt) {
    if (rt->cfg.pinned_budget) return rt->cfg.pinned_budget;
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
        fclose(f);
    }
    return (uint64_t)kb * 1024 / 10 * 9;
}

/* The disk tier's rates, once per run: timed (or read from the cache under
 * cache_dir, per device: profiler_disk.h) by rank 0 alone and sent to the
 * other ranks (an all-reduce where they add zeros), so every rank plans with
 * the same numbers and no two ranks time the same disk at once. A probe that
 * fails leaves the I/O time unmodelled and says why (the store's own checks
 * still refuse a folder that cannot be used). 0, or a failed collective. */
static int tier_rates(pt_rt *rt, char *err, size_t errlen) {
    const pt_config *c = &rt->cfg;
    if (rt->plan.tier_rates[0]) return PT_OK;   /* every rank sets it at its first plan */
    int W = rt->dist.coll ? pt_coll_world(rt->dist.coll) : 1, r0 = W == 1 || pt_coll_rank(rt->dist.coll) == 0;
    double v[2] = {0, 0};
    pt_disk_rates r;
    memset(&r, 0, sizeof r);
    char e[600] = "";
    if (r0 && pt_disk_probe(c->nvme_path, c->nvme_io_threads, c->cache_dir, &r, e, sizeof e))
        PT_LOGW(&rt->lg, "disk tier: its I/O time is not in the plan: %s", e);
    else if (r0)
        v[0] = r.rd_Bps, v[1] = r.wr_Bps;
    if (W > 1) {
        int rc = pt_coll_allreduce(rt->dist.coll, v, 2, PT_COLL_F64, 1.0, "the disk tier's rates of rank 0", err,
                                   errlen);
        if (rc) return rc;
    }
    rt->plan.tier_rd_Bps = v[0];
    rt->plan.tier_wr_Bps = v[1];
    if (!(v[0] > 0 && v[1] > 0))
        snprintf(rt->plan.tier_rates, sizeof rt->plan.tier_rates, "timing %.100s failed%s", c->nvme_path,
                 r0 ? "" : " on rank 0");
    else if (!r0)
        snprintf(rt->plan.tier_rates, sizeof rt->plan.tier_rates, "rank 0's (%d thread(s))", c->nvme_io_threads);
    else
        snprintf(rt->plan.tier_rates, sizeof rt->plan.tier_rates, "%s (%d thread(s), %s)",
                 r.cached ? "from the cache" : "timed at the first plan", c->nvme_io_threads,
                 r.direct ? "O_DIRECT" : "buffered");
    if (r0 && v[0] > 0)
        PT_LOGI(&rt->lg, "disk tier: %s reads %.3g B/s, writes %.3g B/s, %s; timing took %.3f s", c->nvme_path,
                r.rd_Bps, r.wr_Bps, rt->plan.tier_rates, r.probe_s);
    return PT_OK;
}

/* [nvme] path: the disk tier's terms of the search (cost_model.h): its
 * staging slots, block, rates (tier_rates), the store's testing keys, and
 * the disk bytes it may take ([nvme] budget, or the folder's free space). */
static int tier_terms(pt_rt *rt, pt_search_opts *o, char *err, size_t errlen) {
    const pt_config *c = &rt->cfg;
    if (!c->nvme_path[0]) return PT_OK;
    o->cost.tier_slots = c->nvme_slots;
    o->cost.tier_above = o->host_ram;
    o->cost.tier_block = c->nvme_block;
    o->cost.tier_force = (c->debug_tier_force ? 1 : 0) | (c->debug_tier_level << 1);
    int rc = tier_rates(rt, err, errlen);
    if (rc) return rc;
    o->cost.tier_rd_Bps = rt->plan.tier_rd_Bps;
    o->cost.tier_wr_Bps = rt->plan.tier_wr_Bps;
    struct statvfs vs;
    uint64_t avail = statvfs(c->nvme_path, &vs) ? 0 : (uint64_t)vs.f_bavail * vs.f_frsize;
    o->disk_budget = c->nvme_budget ? c->nvme_budget : avail;
    if (c->nvme_budget && avail && avail < c->nvme_budget) o->disk_budget = avail;
    return PT_OK;
}

/* The search, and with several ranks the mode (auto_mode, zero3_shard = auto):
 * A when every chunk stays on the device; else B when some plan's pinned bytes
 * per rank with the offloaded state replicated (fp32 master, m, v, staged param
 * and gradient, the fp32 gradient sum, the swap pool) fit [memory]
 * pinned_budget; else C when they fit with that state split over the ranks;
 * else an error with both figures. zero3_shard = on / off fixes the mode. */
static int pick_mode(pt_rt *rt, const pt_trace *t, pt_search_opts *o, pt_plan *plan,
                     int *shard, char *why, char *err, size_t errlen) {
    int autom = pt_rt_auto_shard(rt);
    int W = rt->dist.coll ? pt_coll_world(rt->dist.coll) : 1;
    if (autom && o->n_persist < 0) {
        /* A whenever every chunk fits, even where the search would call an
         * offloaded plan as fast (then no collective touches a chunk's state) */
        pt_search_opts oa = *o;
        oa.n_persist = t->n_chunk;
        char ea[512];
        if (!pt_search(t, &oa, plan, ea, sizeof ea)) {
            *shard = 0;
            snprintf(why, 400, "auto_mode: A, every chunk fits on the device");
            return PT_OK;
        }
        pt_plan_free(plan);
        pt_plan_init(plan);
    }
    if (autom) o->cost.shard = 0;
    int rc = pt_search(t, o, plan, err, errlen);
    if (!autom) {
        *shard = rt->dist.shard;
        if (!rc && rt->dist.coll)
            snprintf(why, 400, "zero3_shard = %s: %s", rt->cfg.zero3_shard == 1 ? "on" : "off",
                     plan->knobs.n_persist >= plan->n_chunk ? "every chunk fits on the device"
                     : rt->dist.shard                       ? "offloaded state split across the ranks"
                                                            : "offloaded state replicated on every rank");
        return rc;
    }
    if (!rc) {
        *shard = 0;
        if (plan->knobs.n_persist >= plan->n_chunk)
            snprintf(why, 400, "auto_mode: A, every chunk fits on the device");
        else
            snprintf(why, 400, "auto_mode: B, the replicated offloaded state and swap pool need "
                               "%llu pinned bytes per rank, within the budget of %llu",
                     (unsigned long long)plan->cost.host_bytes, (unsigned long long)o->host_ram);
        return PT_OK;
    }
    if (rc != PT_ERR_INFEASIBLE || !strstr(err, "host RAM")) return rc;
    char eb[600];
    snprintf(eb, sizeof eb, "%s", err);
    pt_plan_free(plan);
    pt_plan_init(plan);
    o->cost.shard = 1;
    rc = pt_search(t, o, plan, err, errlen);
    if (rc) {
        char ec[600];
        snprintf(ec, sizeof ec, "%s", err);
        return pt_fail(err, errlen, rc, "auto_mode: no mode fits %d rank(s): mode B (offloaded "
                                        "state replicated on every rank): %s; mode C (split across the %d ranks): "
                                        "%s",
                       W, eb, W, ec);
    }
    *shard = 1;
    uint64_t rep = 0;
    {
        pt_cost_ctx *cx = NULL;
        pt_act_profile ap;
        if (!pt_cost_ctx_new(t, &cx, NULL, 0) && !pt_act_init(cx, &ap)) {
            pt_act_compute(cx, plan->modes, &ap);
            rep = pt_cost_host_bytes(cx, &ap, plan->knobs.n_persist, 0);
            pt_act_free(&ap);
        }
        pt_cost_ctx_free(cx);
    }
    snprintf(why, 400, "auto_mode: C, this plan's offloaded state replicated would need %llu "
                       "pinned bytes per rank, over the budget of %llu; split across %d ranks it needs %llu",
             (unsigned long long)rep, (unsigned long long)o->host_ram, W,
             (unsigned long long)plan->cost.host_bytes);
    return PT_OK;
}

/* Mode C runs the same collectives in the same order on every rank, so every
 * rank must run rank 0's mode and knobs: rank 0's choice is broadcast (an
 * all-reduce where the other ranks add zeros), and a rank whose own search chose
 * otherwise plans again with rank 0's knobs fixed. Mode B tolerates differing
 * knobs (its reductions go region by region), but not a differing mode. */
static int ranks_agree(pt_rt *rt, const pt_trace *t, pt_search_opts *o, pt_plan *plan,
                       int *shard, char *why, char *err, size_t errlen) {
    int r0 = pt_coll_rank(rt->dist.coll) == 0;
    double v[5] = {*shard, plan->knobs.n_persist, plan->knobs.n_buffer, plan->knobs.n_swap,
                   plan->knobs.n_checkpoint};
    if (!r0) memset(v, 0, sizeof v);
    int rc = pt_coll_allreduce(rt->dist.coll, v, 5, PT_COLL_F64, 1.0, "the plan of rank 0", err,
                               errlen);
    if (rc) return rc;
    int s0 = v[0] != 0;
    pt_knobs k0 = {(int32_t)v[1], (int32_t)v[2], (int32_t)v[3], (int32_t)v[4]};
    if (s0 == *shard && (!s0 || !memcmp(&k0, &plan->knobs, sizeof k0))) return PT_OK;
    PT_LOGI(&rt->lg, "this rank's search chose mode %c (n_persist %d n_buffer %d n_swap %d "
                     "n_checkpoint %d); running rank 0's mode %c%s",
            *shard ? 'C' : 'B',
            plan->knobs.n_persist, plan->knobs.n_buffer, plan->knobs.n_swap,
            plan->knobs.n_checkpoint, s0 ? 'C' : 'B', s0 ? " and knobs" : "");
    *shard = s0;
    if (!s0) {   /* B with this rank's own knobs: search again without sharding */
        o->cost.shard = 0;
        pt_plan_free(plan);
        pt_plan_init(plan);
        rc = pt_search(t, o, plan, err, errlen);
    } else {
        o->cost.shard = 1;
        o->n_persist = k0.n_persist;
        o->n_buffer = k0.n_buffer;
        o->n_swap = k0.n_swap;
        o->n_checkpoint = k0.n_checkpoint;
        pt_plan_free(plan);
        pt_plan_init(plan);
        rc = pt_search(t, o, plan, err, errlen);
    }
    if (rc) {
        char e[600];
        snprintf(e, sizeof e, "%s", err);
        return pt_fail(err, errlen, rc, "running rank 0's plan on rank %d: %s",
                       pt_coll_rank(rt->dist.coll), e);
    }
    snprintf(why + strlen(why), 400 - strlen(why), " (rank 0's choice)");
    return PT_OK;
}

/* Rebuild the store under rt->plan.kn, carrying every parameter value (and the
 * optimizer state when it exists) across through a per-parameter image: the
 * host's initial tensors are only guaranteed during post_model_load. */
static int rebuild_keeping_state(pt_rt *rt, char *err, size_t errlen) {
    pt_state_image img;
    int rc = pt_store_snapshot(rt->st, &img, err, errlen);
    if (rc) return rc;
    int had_opt = pt_store_optimizer_ready(rt->st);
    rc = pt_rt_build(rt, 1, err, errlen);
    if (!rc && had_opt) rc = pt_store_optimizer_init(rt->st, err, errlen);
    if (!rc) rc = pt_store_restore(rt->st, &img, err, errlen);
    pt_store_image_free(&img);
    if (rc) rt->broken = rc;
    return rc;
}

int pt_rt_search_and_apply(pt_rt *rt, const pt_trace *t, double prof_s, char *err,
                           size_t errlen) {
    pt_search_opts o;
    pt_search_opts_default(&o);
    o.cost.reserve_bytes = rt->cfg.reserve;
    o.cost.headroom_bytes = rt->cfg.extra_headroom;
    o.cost.clip = rt->plan.plan_clip;
    o.cost.defer = rt->cfg.defer_cpu_steps;
    o.cost.overlap_ar = rt->cfg.overlap_allreduce;
    o.cost.tp_l2 = rt->plan.plan_tp_l2 = tp_l2(rt);
    /* the allocator's fragmentation as the profile measured it, times what
     * calibration learned on top (an under-predicted peak folds measured /
     * predicted into calib.peak, and the prediction already had this factor) */
    o.cost.frag = (t->frag.factor >= 1.0 ? t->frag.factor : 1.0) *
                  (t->calib.peak > 0 ? t->calib.peak : 1.0);
    o.capacity = t->hw.device_capacity;
    o.host_ram = host_budget(rt);
    /* [nvme] path: a plan over the pinned budget puts the offloaded states on disk */
    int rc = tier_terms(rt, &o, err, errlen);
    if (rc) return rc;
    o.n_persist = rt->cfg.n_persist;
    o.n_buffer = rt->cfg.n_buffer;
    o.n_swap = rt->cfg.n_swap;
    o.n_checkpoint = rt->cfg.n_checkpoint;
    /* CKPT recomputes through the host's callback: without it no plan may use it */
    if (!rt->host.recompute_block && o.n_checkpoint < 0) o.n_checkpoint = 0;
    o.cost.shard = rt->dist.shard;
    pt_plan plan;
    pt_plan_init(&plan);
    rc = PT_OK;
    if (t != rt->plan.trace) {  /* keep it: create_optimizer may re-plan (clipping) */
        if (!rt->plan.trace) {
            if (!(rt->plan.trace = calloc(1, sizeof *rt->plan.trace)))
                return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
            pt_trace_init(rt->plan.trace);
        }
        /* a second search (tiles = auto tries several) replaces the kept trace */
        rc = pt_trace_copy(rt->plan.trace, t, err, errlen);
        if (rc) return rc;
    }
    /* search on the profile with what calibration learned applied (times;
     * the peak factor is o.cost.frag) */
    pt_trace cal;
    pt_trace_init(&cal);
    rc = pt_trace_calibrated(&cal, rt->plan.trace, err, errlen);
    char why[400] = "";
    int shard = rt->dist.shard;
    if (!rc) rc = pick_mode(rt, &cal, &o, &plan, &shard, why, err, errlen);
    if (!rc && rt->dist.coll) rc = ranks_agree(rt, &cal, &o, &plan, &shard, why, err, errlen);
    if (rc) {
        pt_trace_free(&cal);
        pt_plan_free(&plan);
        return rc;
    }
    t = &cal;
    rt->dist.shard = shard;
    plan.exec_mode = plan.knobs.n_persist >= plan.n_chunk ? 0 : shard ? 2
                                                                      : 1;
    snprintf(plan.mode_why, sizeof plan.mode_why, "%s", why);
    snprintf(plan.tier_rates, sizeof plan.tier_rates, "%s", rt->plan.tier_rates);
    plan.world_size = t->key.world_size;
    pt_rt_ext_plan_fill(rt, &plan);
    char *text = pt_plan_text(&plan);
    if (text) {
        PT_LOGI(&rt->lg, "plan (profiled in %.3f s, searched %lld candidates in %.3f ms):",
                prof_s, (long long)plan.n_evaluated, plan.search_s * 1e3);
        pt_log_text(&rt->lg, PT_LOG_INFO, text);
        free(text);
        pt_rt_ext_plan_log(rt);   /* the features' share of the states above */
    }
    if (rt->cfg.plan_file[0] && (rc = pt_plan_write_json(&plan, rt->cfg.plan_file, err, errlen))) {
        pt_trace_free(&cal);
        pt_plan_free(&plan);
        return rc;
    }
    if (rt->cfg.timeline_file[0]) {
        /* an unwritable path fails like plan_file: the user asked for the file */
        if (!rt->plan.tl && !(rt->plan.tl = calloc(1, sizeof *rt->plan.tl))) rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
        pt_timeline_free(rt->plan.tl);
        if (!rc) rc = pt_timeline_from_plan(t, &plan, rt->plan.tl, err, errlen);
        if (!rc) rc = pt_timeline_write_file(rt->plan.tl, NULL, 0, rt->cfg.timeline_file, err, errlen);
        if (rc) {
            pt_trace_free(&cal);
            pt_plan_free(&plan);
            return rc;
        }
    }
    rt->plan.pred_peak = plan.cost.peak_bytes;
    rt->plan.pred_iter_s = plan.cost.iter_s;
    rt->plan.pred_fwd_s = plan.cost.fwd_s;
    rt->plan.pred_bwd_s = plan.cost.bwd_s;
    rt->plan.pred_opt_s = plan.cost.opt_s;
    rt->plan.pred_coll[0] = plan.cost.allreduce_s;
    rt->plan.pred_coll[1] = plan.cost.allgather_s;
    rt->plan.pred_coll[2] = plan.cost.reduce_scatter_s;
    rt->plan.swap_interval = plan.swap_interval;
    /* the plan's release window of each swapped arena (the cost model's swap-out
     * schedule), so the runtime holds exactly what the prediction counted */
    free(rt->plan.swap_done);
    rt->plan.swap_done = NULL;
    pt_cost_ctx *cx = NULL;
    pt_act_profile ap;
    if (!pt_cost_ctx_new(t, &cx, err, errlen) && !pt_act_init(cx, &ap)) {
        pt_act_compute(cx, plan.modes, &ap);
        rt->plan.swap_done = malloc((size_t)plan.n_block * sizeof *rt->plan.swap_done);
        if (rt->plan.swap_done) memcpy(rt->plan.swap_done, ap.swap_done, (size_t)plan.n_block * sizeof *rt->plan.swap_done);
        pt_act_free(&ap);
    }
    pt_cost_ctx_free(cx);
    pt_trace_free(&cal);
    rt->plan.kn.n_persist = plan.knobs.n_persist;
    rt->plan.kn.n_buffer = plan.knobs.n_buffer;
    rt->plan.kn.n_swap = plan.knobs.n_swap;
    rt->plan.kn.n_checkpoint = plan.knobs.n_checkpoint;
    rt->plan.kn.source = "searched";
    pt_plan_free(&plan);
    return rebuild_keeping_state(rt, err, errlen);
}

int pt_rt_call_profile_step(pt_rt *rt, char *err, size_t errlen) {
    /* err is the context's error buffer: a hook that fails inside profile_step
     * writes its reason there, which is the real cause of the failure */
    if (err && errlen) err[0] = '\0';
    int hrc = rt->host.profile_step(rt->host.user);
    if (hrc) {
        char inner[640] = "";
        if (err && errlen) snprintf(inner, sizeof inner, "%s", err);
        return pt_fail(err, errlen, PT_ERR_CALLBACK, "%s: the host's profile_step "
                                                     "returned %d%s%s",
                       rt->prof_hook ? rt->prof_hook : "post_model_load", hrc,
                       inner[0] ? "; inside it the plugin reported: " : "", inner);
    }
    return PT_OK;
}

/* Several ranks must all plan from the cache or all profile: profiling runs
 * collectives (and mode C's gathers), so one rank profiling while another
 * trains would leave them waiting for each other. Every rank adds 1 for a miss;
 * a rank that hit drops its trace when any rank missed. */
static int ranks_agree_on_cache(pt_rt *rt, int *hit, char *err, size_t errlen) {
    if (!rt->dist.coll) return PT_OK;
    double miss = !*hit;
    int rc = pt_coll_allreduce(rt->dist.coll, &miss, 1, PT_COLL_F64, 1.0,
                               "the profile-cache decision", err, errlen);
    if (rc) return rc;
    if (miss > 0 && *hit) {
        PT_LOGI(&rt->lg, "profile cache: hit here, but %d of %d rank(s) missed; every rank "
                         "profiles",
                (int)miss, pt_coll_world(rt->dist.coll));
        *hit = 0;
    }
    return PT_OK;
}

/* A cached trace for this model/batch/device/world skips profiling. */
int pt_rt_plan_from_cache(pt_rt *rt, int *hit, char *err, size_t errlen) {
    *hit = 0;
    pt_trace t;
    pt_trace_init(&t);
    char path[600] = "";
    if (!rt->cfg.cache_dir[0]) {
        /* no cache on this rank: a miss (other ranks may have one) */
    } else if (pt_rt_ext_searcher(rt)) {
        /* a feature picking a knob from the profiling run (TiledMLP's tiles =
         * auto: its per-row scratch) needs what a cached trace does not hold:
         * profile again */
        PT_LOGI(&rt->lg, "profile cache: not used with %s", pt_rt_ext_searcher(rt)->search_what);
    } else {
        pt_trace_key key;
        pt_prof_key(rt, &key);
        char warn[512] = "";
        if (pt_trace_cache_load(rt->cfg.cache_dir, &key, &t, warn, sizeof warn) != PT_CACHE_HIT) {
            if (warn[0]) PT_LOGW(&rt->lg, "profile cache: %s; profiling again", warn);
        } else {
            pt_trace_cache_path(rt->cfg.cache_dir, &key, path, sizeof path);
            *hit = 1;
        }
    }
    int rc = ranks_agree_on_cache(rt, hit, err, errlen);
    if (rc || !*hit) {
        *hit = 0;
        pt_trace_free(&t);
        return rc;
    }
    PT_LOGI(&rt->lg, "profile cache: hit %s (no profiling step)", path);
    if (t.calib.peak > 0 || t.calib.fwd > 0 || t.calib.bwd > 0 || t.calib.opt > 0)
        PT_LOGI(&rt->lg, "profile cache: planning with what earlier runs' calibration learned: "
                         "peak x%.4f, forward x%.3f, backward x%.3f, optimizer x%.3f",
                t.calib.peak > 0 ? t.calib.peak : 1.0, t.calib.fwd > 0 ? t.calib.fwd : 1.0,
                t.calib.bwd > 0 ? t.calib.bwd : 1.0, t.calib.opt > 0 ? t.calib.opt : 1.0);
    rc = pt_rt_search_and_apply(rt, &t, 0.0, err, errlen);
    pt_trace_free(&t);
    return rc;
}

int pt_rt_profiling(const pt_rt *rt) {
    return rt->plan.kn.source && !strcmp(rt->plan.kn.source, "bootstrap");
}
