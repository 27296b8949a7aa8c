/*
 * dist_grad.c — data parallel: the gradient of every trainable chunk becomes
 * the mean over the ranks (sum in rank order, times 1/world) inside
 * optimizer_step, before clipping and before any optimizer work, so every rank
 * clips by the same factor and steps the same values.
 *
 * Where each chunk is reduced:
 *  - resident: in place in device memory, after the compute stream is synced
 *    (the MPI transport adds it with the CPU, right on the host backend where
 *    device memory is host memory; on cuda the NCCL transport works on the
 *    device buffer; a 16-bit resident gradient is refused for now);
 *  - offloaded: on the host side, after its D2H copies and before CPU Adam, in
 *    its fp32 accumulator (always kept with several ranks): one fp32 reduction
 *    per step whatever the chunk's dtype and micro-batch count, no device
 *    buffer held for it, and the CPU Adam that follows reads exactly these bytes.
 * Both go region by region with the region's element count, in layout order,
 * so the messages are the same whichever chunks a rank keeps resident: ranks
 * whose plans differ (the search uses each rank's own timings) still match.
 * With [dist] tp_size > 1 (all ranks one tensor-parallel group) nothing is
 * reduced here; only the norms are taken.
 *
 * Mode C (shard.c): offloaded chunks were reduce-scattered at their backward
 * already, so only resident chunks are all-reduced here; for clipping, each
 * rank's partial squared norms of its parts are summed across the ranks once.
 */
#include <stdio.h>

#include "coll.h"
#include "store_internal.h"

int pt_cs_dist_reduce(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    const pt_gpu_backend *o = pt_gpu_ops(st->env.gpu);
    double scale = 1.0 / pt_coll_world(st->env.coll);
    int clip = st->env.opt->max_grad_norm > 0;
    /* tensor parallel (one group, no data parallel): nothing to average. A split
     * param's ranks hold different blocks, and a replicated one's gradient is
     * taken as the host gives it (tensor-parallel hosts compute it identically on
     * every rank of the group) */
    int tp = pt_cs_tp_size(st) > 1;
    /* the host's last backward work on resident gradients is done before the CPU reads them */
    if (o->stream_sync(pt_gpu_impl(st->env.gpu), st->env.s_compute))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: stream_sync of the compute stream failed");
    char what[64];
    for (int k = 0; k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        if (!c->trainable) continue;
        if (c->sh) {   /* reduced at its backward (mode C): only its part's norms */
            if (clip) pt_cs_chunk_norms(st, c, 1);
            continue;
        }
        snprintf(what, sizeof what, "gradient of chunk %d", c->id);
        for (int r = 0; !tp && r < c->lc->n_regions; r++) {
            const pt_chunk_region *g = &c->lc->regions[r];
            if (c->reg_state[r] == UINT64_MAX) continue;
            size_t n = (size_t)(g->bytes / pt_dtype_size(g->dtype));
            void *buf;
            if (!c->persistent) {
                buf = c->h_gacc + c->reg_state[r];
            } else if (g->dtype == PT_F32) {
                buf = (char *)c->d_grad + g->offset;
            } else {
                return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                               "optimizer_step: resident chunk %d holds 16-bit gradients; "
                               "reducing them across ranks is not built yet (fp32 parameters, "
                               "or 16-bit ones in offloaded chunks, are)", c->id);
            }
            double t0 = pt_now_s();
            int rc = pt_coll_allreduce(st->env.coll, buf, n, PT_COLL_F32, scale, what, err,
                                       errlen);
            st->coll_s[0] += pt_now_s() - t0;
            if (rc) return rc;
        }
        if (!c->persistent && clip) pt_cs_chunk_norms(st, c, 1);
    }
    if (!st->shard || !clip) return PT_OK;
    double t0 = pt_now_s();
    int rc = pt_sh_norm_reduce(st, err, errlen);
    st->coll_s[0] += pt_now_s() - t0;
    return rc;
}
