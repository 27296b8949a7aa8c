/*
 * optim_step.c — the optimizer step of the store (optimizer_step and what it
 * needs): waits for the backward's CPU tasks, the data-parallel reduction, the
 * global norm for clipping, the optimizer kind's device steps of resident
 * chunks, its passes after the norm, and the CPU steps left for offloaded
 * chunks, queued in the order the next forward
 * gathers them ([protrain] defer_cpu_steps) or waited for. The CPU side of a
 * chunk's gradient during backward (the tasks this step waits for and the
 * helpers it shares with them) is chunk_runtime.c's. Every step of a chunk
 * goes through the kind's table, st->ok (kinds/optim_kind.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ext.h"
#include "kernels_hd.h"
#include "store_internal.h"

int pt_store_set_lr(pt_store *st, float lr) {
    st->lr_set = 1;
    st->lr_next = lr;
    return PT_OK;
}

int pt_store_want_norms(const pt_store *st) {
    return st->env.opt->max_grad_norm > 0 || st->want_norm;
}

/* The max norm this step clips at; 0: no clipping. */
static float step_max(const pt_store *st) {
    if (st->clip_step > 0) return st->clip_step;
    return st->env.opt->max_grad_norm > 0 ? st->env.opt->max_grad_norm : 0.0f;
}

int pt_store_clips(const pt_store *st) { return step_max(st) > 0; }

/* Wait for every chunk's CPU task; the first failed task's status. */
static int wait_tasks(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    int rc = PT_OK;
    for (int k = 0; k < ms->n_chunks; k++) {
        if (ms->ch[k].persistent) continue;
        char e[320];
        int r = pt_cs_wait_task(st, &ms->ch[k], "optimizer_step", e, sizeof e);
        if (r && !rc) rc = pt_fail(err, errlen, r, "%s", e);
    }
    return rc;
}

/* Squared norms of the resident params' gradients: one device double per param
 * (norm_dev[i]), all queued, then one copy back and one synchronisation. */
static int device_norms(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    pt_model_v1 *m = st->env.model;
    size_t bytes = sizeof(double) * (size_t)m->n_params;
    double *host = malloc(bytes);
    if (!host) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    const char *op = "memset";
    int rc = OPS(st)->memset_async(IMPL(st), ms->norm_dev, 0, bytes, st->env.s_compute);
    if (!rc) op = "sqnorm";
    for (int i = 0; i < m->n_params && !rc; i++) {
        if (ms->root[i] != i || !m->params[i].grad) continue;
        cs_chunk *c = &ms->ch[ms->lay.param_chunk[i]];
        if (!c->persistent) continue;
        uint64_t n = pt_store_param_numel(&m->params[i]);
        rc = OPS(st)->sqnorm(IMPL(st), (char *)c->d_grad + ms->lay.param_offset[i],
                             m->params[i].dtype, (size_t)n, ms->norm_dev + i, st->env.s_compute);
    }
    if (!rc && (op = "memcpy") &&
        !(rc = pt_gpu_memcpy_async(st->env.gpu, host, ms->norm_dev, bytes, PT_GPU_D2H, st->env.s_compute)))
        rc = OPS(st)->stream_sync(IMPL(st), st->env.s_compute), op = "stream_sync";
    if (rc) {
        free(host);
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: gradient-norm reduction failed on the device: %s failed", op);
    }
    for (int i = 0; i < m->n_params; i++)
        if (ms->root[i] == i && m->params[i].grad && ms->ch[ms->lay.param_chunk[i]].persistent)
            ms->psq[i] = host[i];
    free(host);
    return PT_OK;
}

pt_adamw_args pt_store_adamw_args(const pt_store *st, cs_chunk *c, uint64_t s, size_t n, float lr,
                                  float gs) {
    const pt_optim_state *o = st->env.opt;
    pt_adamw_args a;
    memset(&a, 0, sizeof a);
    a.n = n;
    a.m = c->d_m + s;
    a.v = c->d_v + s;
    a.lr = lr;
    a.beta1 = o->beta1;
    a.beta2 = o->beta2;
    a.eps = o->eps;
    a.weight_decay = o->weight_decay;
    pt_adamw_bias(o->beta1, o->beta2, o->t + 1, &a.bc1, &a.bc2_rsqrt);
    a.grad_scale = gs;
    return a;
}

/* The kind's device step of resident chunk c, then its gradient zeroed for the
 * next step's accumulation. */
static int device_step(pt_store *st, cs_chunk *c, float lr, float gs, char *err, size_t errlen) {
    int rc = st->ok->dev_step(st, c, lr, gs, err, errlen);
    if (rc) return rc;
    if (OPS(st)->memset_async(IMPL(st), c->d_grad, 0, (size_t)c->used, st->env.s_compute))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: zeroing chunk %d's device gradient failed: memset failed",
                       c->id);
    return PT_OK;
}

/* A CPU step queued by optimizer_step (constants in the chunk: s_consts, s_acc,
 * s_lr, s_gs, s_k): an AdamW chunk's runners (every worker) each start with
 * the testing delay, and the last one to finish accounts the step's time; a
 * chunk the kind steps as one task (whole_task, or mode C's parts) is one
 * task (step_task) doing the same around its step. */
static void step_start(void *arg) {
    cs_chunk *c = arg;
    double delay = c->owner->env.cfg->debug_cpu_step_delay;
    if (delay > 0) {   /* testing: widen the window a missing wait would leave */
        struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static void step_done(void *arg, double t_first, double t_end) {
    cs_chunk *c = arg;
    if (!pt_cs_stepped_first(c->owner)) {
        pt_cs_stepped(c->owner, c);   /* its time counts as the step's */
        t_end = pt_now_s();
    }
    pt_cs_add_optim_time(c->owner, t_end - t_first);
}

/* The device's steps of every resident trainable chunk, queued on the compute
 * stream behind the backward that wrote their gradients. */
static int device_steps(pt_store *st, float lr, float gs, char *err, size_t errlen) {
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        if (!c->persistent || !c->trainable) continue;
        int rc = device_step(st, c, lr, gs, err, errlen);
        if (rc) return rc;
    }
    return PT_OK;
}

/* Chunk c's CPU step with the constants optimizer_step left in it; grp NULL
 * steps it on this thread. */
static void cpu_step(cs_chunk *c, pt_task_group *grp, const pt_cpu_adam_hooks *h) {
    const pt_optim_cpu a = {&c->s_consts, c->s_acc, c->s_lr, c->s_gs, c->s_k, grp, h};
    c->owner->ok->cpu_step(c->owner, c, &a);
}

static void step_task(void *arg) {
    cs_chunk *c = arg;
    step_start(c);
    double t0 = pt_now_s();
    int trc = c->tiered ? pt_tier_ready(c->owner, c) : PT_OK;   /* its image in a slot */
    if (!trc) cpu_step(c, NULL, NULL);
    if (c->tiered) pt_tier_drop(c->owner, c, trc ? PT_TIER_DISCARD : PT_TIER_DIRTY);
    if (trc) c->t_rc = trc;
    step_done(c, t0, pt_now_s());
}

/* A CPU step of the kind that failed (logged with its cause), taken. */
static int kind_failed(pt_store *st, char *err, size_t errlen) {
    int rc = st->ok->failed ? st->ok->failed(st) : PT_OK;
    if (!rc) return PT_OK;
    return pt_fail(err, errlen, rc, "optimizer_step: a %s step on the CPU failed (the log names "
                                    "the parameter and the cause)",
                   st->ok->name);
}

void pt_store_set_profiling(pt_store *st, int on) { st->profiling = on; }


/* The step's lr: the argument (negative: the optimizer's), or the one set_lr
 * gave the CPU steps that overlapped backward, which an argument must match. */
static int step_lr(pt_store *st, float lr_arg, float *lr, char *err, size_t errlen) {
    pt_optim_state *o = st->env.opt;
    *lr = lr_arg >= 0 ? lr_arg : o->lr;
    if (st->lr_set) {
        if (st->overlapped && lr_arg >= 0 && lr_arg != st->lr_next) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "optimizer_step: lr %g differs from the lr %g given to set_lr, which the CPU "
                                                            "optimizer already applied while backward ran",
                           (double)lr_arg,
                           (double)st->lr_next);
        }
        *lr = st->lr_next;
    }
    o->lr = *lr;
    return PT_OK;
}

/* The offloaded chunks' gradient copies and the CPU tasks queued on them
 * (accumulation, norms, overlapped steps); *cpu_wait += the time waited for
 * the tasks. */
static int wait_offloaded(pt_store *st, double *cpu_wait, char *err, size_t errlen) {
    /* the tasks are waited for even when the copies failed: none may still
     * run when this hook returns */
    int rc = OPS(st)->stream_sync(IMPL(st), st->env.s_d2h)
                 ? pt_fail(err, errlen, PT_ERR_BACKEND,
                           "optimizer_step: stream_sync of the d2h stream failed")
                 : PT_OK;
    double w0 = pt_now_s();
    int trc = wait_tasks(st, rc ? NULL : err, rc ? 0 : errlen);
    *cpu_wait += pt_now_s() - w0;
    if (rc || trc) return rc ? rc : trc;
    /* a step of the last step (deferred) or of this one failed */
    if ((rc = kind_failed(st, err, errlen))) return rc;
    if ((rc = pt_tier_failed(st, err, errlen))) return rc;
    return pt_cs_account_hidden(st, err, errlen);
}

/* Global-norm clipping: the norm of the (reduced) gradient into o->last_norm
 * (NaN without clipping) and the scale the steps apply, min(1, max / (norm + 1e-6)). */
static int clip_scale(pt_store *st, float *gs, char *err, size_t errlen) {
    pt_optim_state *o = st->env.opt;
    pt_model_v1 *m = st->env.model;
    *gs = 1.0f;
    o->last_norm = NAN;
    if (!pt_store_want_norms(st)) return PT_OK;
    int rc = device_norms(st, err, errlen);
    if (rc) return rc;
    double sq = 0, sq_split = 0;
    int tp = pt_cs_tp_size(st) > 1;
    for (int i = 0; i < m->n_params; i++) {
        if (st->root[i] != i || !st->root_tr[i]) continue;
        if (tp && m->params[i].tp_split) sq_split += st->psq[i];
        else sq += st->psq[i];
    }
    /* tensor parallel: each rank holds one block of a split param, so the
     * full tensors' squares are the sum over its group (rank order: the same
     * bits everywhere); a replicated param counts once, from this rank. The
     * gradients are already averaged over the replicas, so every group
     * finds the same norm without a sum across groups */
    if (tp) {
        rc = pt_coll_allreduce(st->env.tp_coll, &sq_split, 1, PT_COLL_F64, 1.0,
                               "squared gradient norm of the split parameters", err, errlen);
        if (rc) return rc;
    }
    sq += sq_split;
    double norm = sqrt(sq);
    o->last_norm = norm;
    float mx = step_max(st);
    if (mx > 0 && norm > mx) *gs = (float)(mx / (norm + 1e-6));
    return PT_OK;
}

/* Norms of offloaded chunks whose gradient task did not compute them (the norm
 * was asked for only after their backward; one rank: several ranks compute
 * them in the reduction). The gradients are in host memory: the tasks are done
 * (a whole image on the disk tier is held in a staging slot meanwhile). */
static int late_norms(pt_store *st, char *err, size_t errlen) {
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        if (c->persistent || !c->trainable || c->sh || c->t_norm) continue;
        int rc = pt_cs_chunk_norms_held(st, c, c->t_n_micro > 1, err, errlen);
        if (rc) return rc;
    }
    return PT_OK;
}

/* The step's gradients complete: buckets started, CPU tasks done, reduced
 * across ranks, norms of every chunk when wanted. Once per step: the
 * clip_grad_norm hook may have done it before optimizer_step. */
static int gather(pt_store *st, double *cpu_wait, char *err, size_t errlen) {
    if (st->reduced) return PT_OK;
    /* several ranks: every gradient bucket's all-reduce started as the device
     * finishes its backward, before this blocks on the copy streams */
    int rc = pt_cs_dist_drain(st, err, errlen);
    if (rc) return rc;
    if (st->n_offloaded && (rc = wait_offloaded(st, cpu_wait, err, errlen))) return rc;
    if (st->env.coll && (rc = pt_cs_dist_reduce(st, err, errlen))) return rc;
    if (!st->env.coll && pt_store_want_norms(st) && (rc = late_norms(st, err, errlen))) return rc;
    st->reduced = 1;
    return PT_OK;
}

int pt_store_clip_grad_norm(pt_store *st, float max_norm, double *norm, char *err,
                            size_t errlen) {
    const pt_optim_state *o = st->env.opt;
    if (!isfinite(max_norm))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "clip_grad_norm: max_norm is %g; it "
                                                        "must be finite (> 0 clips, <= 0 only computes the norm)",
                       (double)max_norm);
    if (max_norm > 0 && o->max_grad_norm > 0 && max_norm != o->max_grad_norm)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "clip_grad_norm: max_norm %g differs "
                                                        "from the optimizer's max_grad_norm %g, which already clips every step; "
                                                        "give one of them (clipping twice would shrink the step twice)",
                       (double)max_norm, (double)o->max_grad_norm);
    /* an offloaded chunk the CPU optimizer already stepped during backward
     * used the unclipped gradient, and without its norm computed first the
     * gradient the norm needs may be gone */
    for (int k = 0; norm && !st->reduced && k < st->n_chunks; k++) {
        const cs_chunk *c = &st->ch[k];
        if (c->persistent || !c->stepped || (c->t_norm && !(max_norm > 0))) continue;
        return pt_fail(err, errlen, PT_ERR_ORDER, "clip_grad_norm: the CPU optimizer already "
                                                  "stepped chunk %d with this step's unclipped gradient while backward ran "
                                                  "(set_lr came before backward and nothing announced the clipping); "
                                                  "announce it before the step's backward (clip_grad_norm with norm NULL) "
                                                  "or give the lr only to optimizer_step",
                       c->id);
    }
    st->want_norm = 1;
    if (!norm) {   /* announced: the backward's tasks compute the norm */
        if (max_norm > 0) st->clip_ann = 1;
        return PT_OK;
    }
    if (max_norm > 0) st->clip_step = max_norm;
    double cpu_wait = 0;
    int rc = gather(st, &cpu_wait, err, errlen);
    pt_cs_add_optim_wait(st, cpu_wait);
    if (!rc && !st->normed && !(rc = clip_scale(st, &st->step_gs, err, errlen))) st->normed = 1;
    if (!rc && st->normed && max_norm > 0) {   /* a later call may set the clip */
        float mx = step_max(st);
        st->step_gs = mx > 0 && o->last_norm > mx ? (float)(mx / (o->last_norm + 1e-6)) : 1.0f;
    }
    if (!rc) *norm = o->last_norm;
    return rc;
}

/* CPU steps that could not overlap (clipping, or lr unknown during backward),
 * queued in layout order = the order the next forward gathers the chunks.
 * Deferred, each goes into the chunk's own group (its upload and every
 * host-side reader wait on that); else into g, waited for by the caller. */
static void queue_cpu_steps(pt_store *st, float lr, float gs, pt_task_group *g) {
    int defer = st->env.cfg->defer_cpu_steps;
    for (int k = 0; st->n_offloaded && k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        if (c->persistent || !c->trainable || c->stepped) continue;
        c->s_acc = st->env.sx->n_micro > 1 || st->env.coll;
        pt_cs_step_consts(st, lr, gs, &c->s_consts);
        c->s_lr = lr;
        c->s_gs = gs;
        c->s_k = st->env.opt->t + 1;
        /* negative control: chunk_stepped before the step (its previous
         * tasks were waited for above, so nothing else touches it now) */
        if (pt_cs_stepped_first(st)) pt_cs_stepped(st, c);
        if (c->sh || c->tiered || (st->ok->whole_task && st->ok->whole_task(c))) {
            /* one task: the kind's own loop, this rank's mode C parts, or a
             * tiered chunk's read, step (every worker) and write-back */
            if (c->tiered) pt_tier_hold(st, c);
            if (pt_pool_submit(st->workers, step_task, c, defer ? &c->sg : g, NULL, 0)) {
                step_task(c);   /* no task node: step it here */
                continue;
            }
        } else {
            /* every worker on this chunk, then on the next: the runners of
             * chunk k are queued ahead of chunk k + 1's, so the chunks finish
             * one by one in gather order at the rate of all threads */
            const pt_cpu_adam_hooks h = {step_start, step_done, c};
            cpu_step(c, defer ? &c->sg : g, &h);
        }
        c->step_pending = defer;
    }
}

/* Streamed copies in slots are stale now: drop their tags (and poison them,
 * so a host that kept a pointer reads NaN). Their gradient copies are done
 * (the CPU steps waited for them); ordered, the fill queues behind the host's
 * last use of the slot and the next upload into it waits for the fill. */
static int drop_stale_copies(pt_store *st, char *err, size_t errlen) {
    int prc = PT_OK;
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        c->stepped = 0;
        if (c->persistent || !c->trainable) continue;
        int32_t s = pt_bufpool_lookup(st->pool, c->id);
        if (s < 0) continue;
        /* untagged first: whatever fails below, no later gather takes the stale copy */
        pt_bufpool_invalidate(st->pool, c->id, NULL, 0);
        if (st->env.cfg->poison) {
            const char *op =
                OPS(st)->memset_async(IMPL(st), pt_bufpool_slot_ptr(st->pool, s), 0xFF,
                                      (size_t)pt_bufpool_slot_size(st->pool, s),
                                      pt_cs_ord(st, PT_ORD_STEP) ? st->env.s_compute : NULL)
                    ? "memset"
                : st->env.ordered &&
                        OPS(st)->event_record(IMPL(st), st->slot_used[s], st->env.s_compute)
                    ? "event_record"
                    : NULL;
            /* the step itself is done: its bookkeeping below still runs */
            if (op && !prc)
                prc = pt_fail(err, errlen, PT_ERR_BACKEND,
                              "optimizer_step: poisoning the stale copy of chunk %d failed: %s "
                              "failed",
                              c->id, op);
        }
    }
    return prc;
}

int pt_store_optimizer_step(pt_store *st, float lr_arg, char *err, size_t errlen) {
    pt_optim_state *o = st->env.opt;
    float lr;
    int rc = step_lr(st, lr_arg, &lr, err, errlen);
    if (rc) return rc;
    /* One rank, no clipping, no tensor parallel: the resident chunks' steps
     * need neither a global norm nor a reduction, so they are queued before
     * this hook waits for the CPU's steps of the offloaded chunks, and the
     * device steps while the CPU finishes (the cost model's overlapped
     * schedule: fwd + max(bwd + device, CPU)). They were queued after that
     * wait, which added the whole device step to every streamed iteration. */
    const int early = !st->reduced && !st->env.coll && !pt_store_clips(st) &&
                      pt_cs_tp_size(st) <= 1;
    if (early && (rc = device_steps(st, lr, 1.0f, err, errlen))) return rc;
    double cpu_wait = 0;   /* this hook's waits for CPU optimizer tasks (not for copies) */
    if ((rc = gather(st, &cpu_wait, err, errlen))) return rc;
    float gs = st->step_gs;
    if (!st->normed && (rc = clip_scale(st, &gs, err, errlen))) return rc;
    /* the kind's steps that need the whole group (tensor parallel, mode C's
     * owners), before the chunks' steps (a resident one zeroes its gradient) */
    if (st->ok->pass && (rc = st->ok->pass(st, lr, gs, err, errlen))) return rc;
    pt_task_group g = PT_TASK_GROUP_INIT;
    queue_cpu_steps(st, lr, gs, &g);
    if (!early && (rc = device_steps(st, lr, gs, err, errlen))) {
        pt_pool_wait(st->workers, &g);
        return rc;
    }
    double w1 = pt_now_s();
    pt_pool_wait(st->workers, &g);
    /* what the host waited for CPU work: the gradient tasks (accumulation, norms,
     * overlapped steps) once their copies were in, and the steps when not
     * deferred (deferred ones count where an upload waits for them) */
    pt_cs_add_optim_wait(st, cpu_wait + pt_now_s() - w1);
    if ((rc = kind_failed(st, err, errlen))) return rc;
    /* A host computing on its own thread reads the device AdamW's results right
     * after this hook; an ordered host's next work queues behind it anyway. */
    if (!st->env.ordered && OPS(st)->stream_sync(IMPL(st), st->env.s_compute)) {
        return pt_fail(err, errlen, PT_ERR_BACKEND, "optimizer_step: stream_sync of the compute stream failed");
    }
    int prc = drop_stale_copies(st, err, errlen);
    st->lr_set = 0;
    st->overlapped = 0;
    st->want_norm = st->clip_ann = st->reduced = st->normed = 0;
    st->clip_step = 0;
    o->t++;
    return prc;
}
