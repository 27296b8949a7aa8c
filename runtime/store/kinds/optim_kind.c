/*
 * optim_kind.c — the optimizer kinds' tables (optim_kind.h) and AdamW's steps
 * of a chunk. AdamW keeps no state beyond the chunk's m / v (and fp32 masters,
 * which the store owns): it plans nothing, has no init, pass or image words.
 * Its steps hand the chunk's view (optim/optim_chunk.h: its trainable
 * regions, the copies and state it steps) to runtime/optim's AdamW over a
 * view, element-wise over each region (the update of cpu_adam.h, the same
 * element body on both sides), on the device through the backend's adamw op
 * and on the CPU as one job whose slices every worker shares. REKLS's table
 * points at rekls_store.c and rekls_dist.c, and at AdamW's steps for chunks
 * holding none of its params; its cpu_seconds (here) is rekls.c's time model.
 */
#include <stdlib.h>
#include <string.h>

#include "rekls_store.h"

/* Chunk c's region r as a view's region. */
static pt_optim_region view_region(const cs_chunk *c, int r) {
    const pt_chunk_region *g = &c->lc->regions[r];
    return (pt_optim_region){g->offset, g->bytes / pt_dtype_size(g->dtype), c->reg_state[r],
                             g->dtype};
}

/* Chunk c's view (optim/optim_chunk.h) over its device copies (resident) or
 * its pinned ones: its trainable regions into reg (room for all of the
 * chunk's), or none when reg is NULL. */
static void chunk_view(const cs_chunk *c, int resident, pt_optim_region *reg,
                       pt_optim_chunk *v) {
    memset(v, 0, sizeof *v);
    v->id = c->id;
    v->reg = reg;
    for (int r = 0; reg && r < c->lc->n_regions; r++)
        if (c->reg_state[r] != UINT64_MAX) reg[v->n_regions++] = view_region(c, r);
    v->param = resident ? c->d_param : c->h_param;
    v->grad = resident ? c->d_grad : c->h_gstage;
    v->gacc = resident ? NULL : c->h_gacc;
    v->master = resident ? c->d_master : c->h_master;
    v->m = resident ? c->d_m : c->h_m;
    v->v = resident ? c->d_v : c->h_v;
    v->state = c->opt;
}

/* The regions of a view: on the stack for the usual few, else allocated
 * (NULL: out of host memory). */
enum { VIEW_STACK = 8 };
static pt_optim_region *view_regions(const cs_chunk *c, pt_optim_region *stack) {
    int n = c->lc->n_regions;
    return n <= VIEW_STACK ? stack : malloc(sizeof(pt_optim_region) * (size_t)n);
}

/* Device AdamW over every trainable region of resident chunk c. */
static int adamw_dev_step(pt_store *st, cs_chunk *c, float lr, float gs, char *err,
                          size_t errlen) {
    pt_optim_region stack[VIEW_STACK], *reg = view_regions(c, stack);
    if (!reg)
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "optimizer_step: out of host memory for "
                                                     "chunk %d's %d regions",
                       c->id, (int)c->lc->n_regions);
    pt_optim_chunk v;
    chunk_view(c, 1, reg, &v);
    pt_adamw_args hyper = pt_store_adamw_args(st, c, 0, 0, lr, gs);
    int rc = pt_adamw_chunk_dev(OPS(st), IMPL(st), st->env.s_compute, st->d_gtmp, &v, &hyper,
                                err, errlen);
    if (reg != stack) free(reg);
    return rc;
}

/* AdamW over every trainable region of an offloaded chunk, as one job whose
 * slices every worker shares (pt_adamw_chunk_cpu): grp NULL steps it now
 * (from a worker: the wait runs the job's queued slices itself), else the
 * runners are queued into grp with hooks h. A mode C chunk is stepped over
 * this rank's parts on this thread (the store queues it as one task and
 * passes grp NULL). */
static void adamw_cpu_step(pt_store *st, cs_chunk *c, const pt_optim_cpu *o) {
    const pt_adamw_consts *k = o->k;
    if (c->sh) {
        pt_sh_adam(c, k, o->from_acc);
        return;
    }
    pt_optim_region stack[VIEW_STACK], *reg = view_regions(c, stack);
    pt_optim_chunk v;
    if (reg) {
        chunk_view(c, 0, reg, &v);
        pt_adamw_chunk_cpu(st->workers, &v, k, o->from_acc, o->grp, o->h);
        if (reg != stack) free(reg);
        return;
    }
    /* no memory for the regions: each one alone, now, the same math */
    chunk_view(c, 0, NULL, &v);
    for (int r = 0; r < c->lc->n_regions; r++) {
        if (c->reg_state[r] == UINT64_MAX) continue;
        pt_optim_region one = view_region(c, r);
        v.reg = &one;
        v.n_regions = 1;
        pt_adamw_chunk_cpu(st->workers, &v, k, o->from_acc, NULL, NULL);
    }
    const pt_cpu_adam_hooks *h = o->h;
    if (h && h->done) h->done(h->ctx, pt_now_s(), pt_now_s());   /* stepped above */
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
