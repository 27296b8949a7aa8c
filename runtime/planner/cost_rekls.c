/*
 * cost_rekls.c — REKLS under mode C in the cost model.
 *
 * In mode C every REKLS param of a split chunk lives whole at one owner rank
 * (its factors, bases, eigenvalues and both moments: aux + 2 m n fp32 words),
 * so its state is not divided by the ranks like the chunks' parts. The
 * runtime's owner rule guarantees every rank at most ceil(T / W) + w_max words
 * (T: the REKLS words of all split chunks, w_max: one param's largest), and
 * the planner charges each rank exactly that bound:
 *
 *   host per rank = ceil((H - A) / W) + 4 (ceil(T / W) + w_max)
 *
 * with H the replicated pinned bytes of the offloaded chunks (what mode B pins,
 * REKLS's factors included) and A the factors' share of H (4 bytes per aux
 * word). The chunk's m / v parts of a REKLS param stay allocated (unused) and
 * are in H - A.
 *
 * Time: each step gathers a param's gradient at its owner and sends the update
 * back, at most 2 m n floats moved per param (less the owner's own part), on
 * the hook thread inside optimizer_step; charged like an all-gather of those
 * bytes (the bus convention of the collectives' rates). The owners' steps are
 * not deferred into the next forward (the exchange is a collective on the hook
 * thread), so cost_time.c counts them as exposed, divided by the ranks like the
 * rest of mode C's CPU work.
 */
#include <stdlib.h>

#include "cost_internal.h"
#include "protrain.h"

int pt_cost_rekls_ctx(pt_cost_ctx *cx) {
    size_t k1 = (size_t)cx->K + 1;
    cx->rk_aux = calloc(k1, sizeof(uint64_t));
    cx->rk_mn = calloc(k1, sizeof(uint64_t));
    cx->rk_max = calloc(k1, sizeof(uint64_t));
    if (!cx->rk_aux || !cx->rk_mn || !cx->rk_max) return PT_ERR_HOST_OOM;
    for (int32_t k = 0; k < cx->K; k++) {
        const pt_trace_chunk *c = &cx->t->chunks[k];
        int nm = !c->mandatory;   /* mandatory chunks are never offloaded, so never split */
        cx->rk_aux[k + 1] = cx->rk_aux[k] + (nm ? c->optim_aux_words : 0);
        cx->rk_mn[k + 1] = cx->rk_mn[k] + (nm ? c->optim_mn : 0);
    }
    for (int32_t k = cx->K - 1; k >= 0; k--) {   /* suffix maximum */
        const pt_trace_chunk *c = &cx->t->chunks[k];
        uint64_t w = c->mandatory ? 0 : c->optim_own_max;
        cx->rk_max[k] = w > cx->rk_max[k + 1] ? w : cx->rk_max[k + 1];
    }
    return PT_OK;
}

void pt_cost_rekls_ctx_free(pt_cost_ctx *cx) {
    free(cx->rk_aux);
    free(cx->rk_mn);
    free(cx->rk_max);
}

uint64_t pt_cost_rekls_owner_bytes(const pt_cost_ctx *cx, int32_t p) {
    uint64_t W = (uint64_t)cx->t->key.world_size;
    p = imin(imax(p, 0), cx->K);
    uint64_t T = rsum(cx->rk_aux, p, cx->K) + 2 * rsum(cx->rk_mn, p, cx->K);
    if (!T || W < 2) return 0;
    return 4 * ((T + W - 1) / W + cx->rk_max[p]);
}

uint64_t pt_cost_rekls_shard_host(const pt_cost_ctx *cx, int32_t p, uint64_t h_rep) {
    uint64_t W = (uint64_t)cx->t->key.world_size;
    p = imin(imax(p, 0), cx->K);
    uint64_t A = 4 * rsum(cx->rk_aux, p, cx->K);
    if (A > h_rep) A = h_rep;
    return (h_rep - A + W - 1) / W + pt_cost_rekls_owner_bytes(cx, p);
}

double pt_cost_rekls_shard_xchg_s(const pt_cost_ctx *cx, int32_t p) {
    p = imin(imax(p, 0), cx->K);
    return 8.0 * (double)rsum(cx->rk_mn, p, cx->K) * cx->ag_f;
}
