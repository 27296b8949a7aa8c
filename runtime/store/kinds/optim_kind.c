/*
 * optim_kind.c — the optimizer kinds' tables (optim_kind.h) and AdamW's steps
 * of a chunk. AdamW keeps no state beyond the chunk's m / v (and fp32 masters,
 * which the store owns): it plans nothing, has no init, pass or image words.
 * Its steps are element-wise over each trainable region of the chunk (the
 * update of cpu_adam.h, the same element body on both sides), on the device
 * through the backend's adamw op (a 16-bit gradient widened
 * into fp32 scratch first, the 16-bit copy written from the fp32 master), and
 * on the CPU as one job whose slices every worker shares. REKLS's table
 * points at rekls_store.c and rekls_dist.c, and at AdamW's steps for chunks
 * holding none of its params; its cpu_seconds (here) is rekls.c's time model.
 */
#include <stdlib.h>
#include <string.h>

#include "rekls_store.h"

/* Device AdamW over every trainable region of resident chunk c. */
static int adamw_dev_step(pt_store *st, cs_chunk *c, float lr, float gs, char *err,
                          size_t errlen) {
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (c->reg_state[r] == UINT64_MAX) continue;
        uint64_t s = c->reg_state[r], n = g->bytes / pt_dtype_size(g->dtype);
        pt_adamw_args a = pt_store_adamw_args(st, c, s, (size_t)n, lr, gs);
        if (g->dtype == PT_F32) {
            a.param = (float *)((char *)c->d_param + g->offset);
            a.grad = (const float *)((char *)c->d_grad + g->offset);
        } else {
            /* widen the 16-bit gradient into fp32 scratch first */
            if (OPS(st)->convert(IMPL(st), st->d_gtmp, PT_F32, (char *)c->d_grad + g->offset,
                                 g->dtype, (size_t)n, 0, st->env.s_compute))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "optimizer_step: widening chunk %d's 16-bit gradient failed: "
                               "convert failed", c->id);
            a.param = c->d_master + s;
            a.grad = st->d_gtmp;
            a.param_out = (char *)c->d_param + g->offset;
            a.out_dtype = g->dtype;
        }
        if (OPS(st)->adamw(IMPL(st), &a, st->env.s_compute))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "optimizer_step: device AdamW failed on chunk %d: adamw failed", c->id);
    }
    return PT_OK;
}

/* AdamW over every trainable region of an offloaded chunk, as one job whose
 * slices every worker shares (pt_cpu_adam_step_many): grp NULL steps it now
 * (from a worker: the wait runs the job's queued slices itself), else the
 * runners are queued into grp with hooks h. The regions' args are built here;
 * the job keeps its own copy. A mode C chunk is stepped over this rank's parts
 * on this thread (the store queues it as one task and passes grp NULL). */
static void adamw_cpu_step(pt_store *st, cs_chunk *c, const pt_optim_cpu *o) {
    const pt_adamw_consts *k = o->k;
    if (c->sh) {
        pt_sh_adam(c, k, o->from_acc);
        return;
    }
    pt_cpu_adam_args one, *a = c->lc->n_regions > 1 ? malloc(sizeof *a * (size_t)c->lc->n_regions) : &one;
    memset(&one, 0, sizeof one);
    int n = 0;
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (c->reg_state[r] == UINT64_MAX) continue;
        uint64_t s = c->reg_state[r];
        pt_cpu_adam_args x;
        memset(&x, 0, sizeof x);
        x.n = (size_t)(g->bytes / pt_dtype_size(g->dtype));
        x.c = *k;
        x.m = c->h_m + s;
        x.v = c->h_v + s;
        if (o->from_acc) {
            x.g = c->h_gacc + s;
            x.g_dtype = PT_F32;
        } else {
            x.g = (char *)c->h_gstage + g->offset;
            x.g_dtype = g->dtype;
        }
        if (g->dtype == PT_F32) {
            x.p = (float *)((char *)c->h_param + g->offset);
        } else {
            x.p = c->h_master + s;
            x.out = (char *)c->h_param + g->offset;
            x.out_dtype = g->dtype;
        }
        if (a) a[n++] = x;
        else pt_cpu_adam_range(&x, 0, x.n);   /* no memory for the list: this thread, same math */
    }
    /* a queueing failure leaves the update complete after the wait (the
     * runners that could not be queued ran inline), so nothing to report */
    const pt_cpu_adam_hooks *h = o->h;
    if (a) pt_cpu_adam_step_many(st->workers, a, n, o->grp, h, NULL, 0);
    else if (h && h->done) h->done(h->ctx, pt_now_s(), pt_now_s());   /* stepped above */
    if (a != &one) free(a);
}

/* REKLS's CPU step of a chunk's params beyond the Adam update: its GEMMs and
 * eigendecompositions at the rates rekls.c's probes measure (a fixed cost per
 * call plus FLOPs at a rate; pt_rekls_predict_s). */
static double rekls_cpu_seconds(pt_optim_rates *r, const pt_optim_terms *t) {
    _Static_assert(sizeof(pt_rekls_rates) <= sizeof r->w, "pt_optim_rates too small for REKLS");
    pt_rekls_rates rk;
    if (t->n_params <= 0) return 0;
    if (!r->measured) {
        pt_rekls_measure_rates(&rk);
        memcpy(r->w, &rk, sizeof rk);
        r->measured = 1;
    }
    memcpy(&rk, r->w, sizeof rk);
    return pt_rekls_predict_s(&rk, t->n_params, t->gemm_flops, t->eigh_flops);
}

const pt_optim_kind pt_optk_adamw = {
    .name = "AdamW",
    .id = PT_OPTIM_ADAMW,
    .dev_step = adamw_dev_step,
    .cpu_step = adamw_cpu_step,
};

const pt_optim_kind pt_optk_rekls = {
    .name = "REKLS",
    .id = PT_OPTIM_REKLS,
    .plan_chunk = pt_rk_plan_chunk,
    .plan_store = pt_rk_plan_store,
    .init = pt_rk_init,
    .fini = pt_rk_fini,
    .whole_task = pt_rk_whole_task,
    .dev_step = pt_rk_dev_step,
    .cpu_step = pt_rk_cpu_step,
    .pass = pt_rk_pass,
    .failed = pt_rk_failed,
    .param_state = pt_rk_param_state,
    .views_open = pt_rk_sh_views_open,
    .views_close = pt_rk_sh_views_close,
    .cpu_seconds = rekls_cpu_seconds,
};

const pt_optim_kind *pt_optk_of(int t) {
    return t == PT_OPTIM_REKLS ? &pt_optk_rekls : &pt_optk_adamw;
}

const pt_optim_kind *pt_optk_find(int id) {
    static const pt_optim_kind *const all[] = {&pt_optk_adamw, &pt_optk_rekls};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]->id == id) return all[i];
    return NULL;
}
