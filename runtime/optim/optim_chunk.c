/*
 * optim_chunk.c — AdamW over a chunk's view (optim_chunk.h): the regions'
 * device ops and the one CPU job over all of them.
 */
#include <stdlib.h>
#include <string.h>

#include "optim_chunk.h"
#include "protrain.h"
#include "pt_util.h"

int pt_adamw_chunk_dev(const pt_gpu_backend *ops, void *impl, pt_stream *s, float *scratch,
                       const pt_optim_chunk *c, const pt_adamw_args *hyper, char *err,
                       size_t errlen) {
    for (int r = 0; r < c->n_regions; r++) {
        const pt_optim_region *g = &c->reg[r];
        uint64_t st = g->state;
        pt_adamw_args a = *hyper;
        a.n = (size_t)g->n;
        a.m = c->m + st;
        a.v = c->v + st;
        if (g->dtype == PT_F32) {
            a.param = (float *)((char *)c->param + g->offset);
            a.grad = (const float *)((const char *)c->grad + g->offset);
        } else {
            /* widen the 16-bit gradient into fp32 scratch first */
            if (ops->convert(impl, scratch, PT_F32, (const char *)c->grad + g->offset, g->dtype,
                             (size_t)g->n, 0, s))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "optimizer_step: widening chunk %d's 16-bit gradient failed: "
                               "convert failed",
                               c->id);
            a.param = c->master + st;
            a.grad = scratch;
            a.param_out = (char *)c->param + g->offset;
            a.out_dtype = g->dtype;
        }
        if (ops->adamw(impl, &a, s))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "optimizer_step: device AdamW failed on chunk %d: adamw failed", c->id);
    }
    return PT_OK;
}

void pt_adamw_chunk_cpu(pt_pool *pool, const pt_optim_chunk *c, const pt_adamw_consts *k,
                        int from_acc, pt_task_group *grp, const pt_cpu_adam_hooks *h) {
    pt_cpu_adam_args one, *a = c->n_regions > 1 ? malloc(sizeof *a * (size_t)c->n_regions) : &one;
    memset(&one, 0, sizeof one);
    int n = 0;
    for (int r = 0; r < c->n_regions; r++) {
        const pt_optim_region *g = &c->reg[r];
        uint64_t s = g->state;
        pt_cpu_adam_args x;
        memset(&x, 0, sizeof x);
        x.n = (size_t)g->n;
        x.c = *k;
        x.m = c->m + s;
        x.v = c->v + s;
        if (from_acc) {
            x.g = c->gacc + s;
            x.g_dtype = PT_F32;
        } else {
            x.g = (const char *)c->grad + g->offset;
            x.g_dtype = g->dtype;
        }
        if (g->dtype == PT_F32) {
            x.p = (float *)((char *)c->param + g->offset);
        } else {
            x.p = c->master + s;
            x.out = (char *)c->param + g->offset;
            x.out_dtype = g->dtype;
        }
        if (a) a[n++] = x;
        else pt_cpu_adam_range(&x, 0, x.n);   /* no memory for the list: this thread, same math */
    }
    /* a queueing failure leaves the update complete after the wait (the
     * runners that could not be queued ran inline), so nothing to report */
    if (a) pt_cpu_adam_step_many(pool, a, n, grp, h, NULL, 0);
    else if (h && h->done) h->done(h->ctx, pt_now_s(), pt_now_s());   /* stepped above */
    if (a != &one) free(a);
}
