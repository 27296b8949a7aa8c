/*
 * dist_shard.c — mode C (ZeRO-3-style sharded offload): every offloaded chunk is
 * split across the data-parallel ranks, region by region (a region holds
 * params of one dtype, so a part never splits an element). For a region of n
 * elements each rank stores s = ceil(n / W) of them (pt_coll_part: rank r owns
 * [r*s, min((r+1)*s, n))); the tail ranks' unused elements are padding, at
 * most W - 1 elements per region, plus the 64-byte alignment of each part.
 *
 * Per offloaded chunk a rank holds only its parts of: the parameters (fp32:
 * they are the masters), the staged gradient, Adam m and v and the fp32
 * gradient sum. So pinned memory and CPU Adam work per rank are the mode B
 * figures divided by W, plus that padding.
 *
 *  - gather: upload this rank's parts into the device slot, then all-gather
 *    the other ranks' parts into the same slot (on the host backend device
 *    memory is host memory, so the collective reads and writes the slot);
 *  - after the chunk's backward: reduce-scatter of the slot's fp32 gradient
 *    (rank-order sum times 1/W: the same bits the all-reduce of mode B forms
 *    for that part), then only this rank's part is copied to the host, and the
 *    CPU task accumulates and steps only that part;
 *  - the next gather's all-gather spreads the updated values.
 * Both collectives run on the hook thread, so every rank must issue them in
 * the same order: the ranks run one plan (core makes them agree), and the pool's
 * hits and prefetches are then the same on every rank.
 *
 * Trainable 16-bit regions are refused for now: the reduce-scatter sums fp32
 * (a 16-bit one would round at every rank) and the masters would need sharding
 * too. Frozen regions of any dtype are sharded (the all-gather only copies).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "device_ext.h"
#include "kernels_hd.h"
#include "store_internal.h"


static uint64_t align64(uint64_t x) { return (x + 63) / 64 * 64; }

int pt_sh_setup(pt_store *st, cs_chunk *c, char *err, size_t errlen) {
    int nr = c->lc->n_regions;
    c->sh = calloc(1, sizeof *c->sh);
    if (c->sh) c->sh->r = calloc((size_t)(nr ? nr : 1), sizeof *c->sh->r);
    if (!c->sh || !c->sh->r)
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    uint64_t off = 0, state = 0;
    for (int r = 0; r < nr; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        cs_shreg *q = &c->sh->r[r];
        uint64_t es = pt_dtype_size(g->dtype);
        size_t lo, len, z, s;
        q->n = g->bytes / es;
        pt_coll_part((size_t)q->n, st->world, 0, &z, &s);
        pt_coll_part((size_t)q->n, st->world, st->rank, &lo, &len);
        q->s = s;
        q->lo = lo;
        q->own = len;
        off = align64(off);
        q->hp_off = off;
        off += q->s * es;
        q->st_full = c->reg_state[r];
        q->st_sh = UINT64_MAX;
        if (c->reg_state[r] == UINT64_MAX) continue;
        if (g->dtype != PT_F32)
            return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                           "[protrain] zero3_shard: chunk %d holds trainable 16-bit parameters; "
                           "sharding them across ranks (mode C) is not built yet (fp32 "
                           "parameters are; mode B runs 16-bit ones)",
                           c->id);
        q->st_sh = state;
        c->reg_state[r] = state;
        state += q->s;
    }
    c->sh->p_bytes = off ? off : 64;
    c->sh->n_state_full = c->n_state;
    c->n_state = state;
    return PT_OK;
}

void pt_sh_free(cs_chunk *c) {
    if (!c->sh) return;
    free(c->sh->r);
    free(c->sh);
    c->sh = NULL;
}

uint64_t pt_sh_pinned(const cs_chunk *c, int rounded) {
    uint64_t pb = rounded ? pt_gpu_round_size(c->sh->p_bytes) : c->sh->p_bytes;
    if (!c->trainable) return pb;
    uint64_t eb = (uint64_t)c->n_state * 4;
    if (rounded) eb = pt_gpu_round_size(eb);
    return pb + 3 * eb;   /* h_param, h_gstage (fp32), m, v */
}

/* The chunk's params laid out as in the device slot, from the host's tensors. */
static void *full_from_init(pt_store *st, cs_chunk *c) {
    char *full = calloc(1, (size_t)(c->used ? c->used : 1));
    if (!full) return NULL;
    for (int j = 0; j < c->lc->n_params; j++) {
        int root = st->lay.order[c->lc->first_param + j];
        const pt_param_v1 *p = &st->env.model->params[root];
        memcpy(full + st->lay.param_offset[root], p->init,
               (size_t)(pt_store_param_numel(p) * pt_dtype_size(p->dtype)));
    }
    return full;
}

/* this rank's parts: full chunk image <-> h_param (to_full: parts into the image) */
static void parts_xfer(cs_chunk *c, char *full, char *hp, int to_full) {
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        const cs_shreg *q = &c->sh->r[r];
        uint64_t es = pt_dtype_size(g->dtype);
        char *a = full + g->offset + q->lo * es, *b = hp + q->hp_off;
        if (!q->own) continue;
        if (to_full) memcpy(a, b, (size_t)(q->own * es));
        else memcpy(b, a, (size_t)(q->own * es));
    }
}

void pt_sh_init_values(pt_store *st, cs_chunk *c) {
    char *full = full_from_init(st, c);
    if (full) {
        parts_xfer(c, full, c->h_param, 0);
        free(full);
        return;
    }
    /* no room for a chunk-sized temporary: param by param, element ranges */
    for (int j = 0; j < c->lc->n_params; j++) {
        int root = st->lay.order[c->lc->first_param + j];
        const pt_param_v1 *p = &st->env.model->params[root];
        uint64_t off = st->lay.param_offset[root], es = pt_dtype_size(p->dtype);
        uint64_t n = pt_store_param_numel(p);
        for (int r = 0; r < c->lc->n_regions; r++) {
            const pt_chunk_region *g = &c->lc->regions[r];
            const cs_shreg *q = &c->sh->r[r];
            if (off < g->offset || off >= g->offset + g->bytes) continue;
            uint64_t e0 = (off - g->offset) / es, a = e0 > q->lo ? e0 : q->lo;
            uint64_t b = e0 + n < q->lo + q->own ? e0 + n : q->lo + q->own;
            if (b > a)
                memcpy((char *)c->h_param + q->hp_off + (a - q->lo) * es,
                       (const char *)p->init + (a - e0) * es, (size_t)((b - a) * es));
        }
    }
}

int pt_sh_upload(pt_store *st, cs_chunk *c, void *dst, char *err, size_t errlen) {
    const char *op = NULL;
    for (int r = 0; r < c->lc->n_regions && !op; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        const cs_shreg *q = &c->sh->r[r];
        uint64_t es = pt_dtype_size(g->dtype);
        if (q->own && pt_gpu_memcpy_async(st->env.gpu, (char *)dst + g->offset + q->lo * es,
                                          (char *)c->h_param + q->hp_off, (size_t)(q->own * es),
                                          PT_GPU_H2D, st->env.s_h2d))
            op = "memcpy";
    }
    if (!op && OPS(st)->event_record(IMPL(st), c->ev_up, st->env.s_h2d)) op = "event_record";
    /* the all-gather writes the other parts (the CPU on MPI, NCCL's own stream
     * on cuda), outside the h2d stream: after our part landed (and, through the
     * h2d stream's waits, after the slot's last use) */
    if (!op && !(st->env.skip & PT_ORD_SHARD) && OPS(st)->event_sync(IMPL(st), c->ev_up))
        op = "event_sync";
    if (op)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "upload of this rank's part of chunk %d failed: %s failed", c->id, op);
    char what[64];
    snprintf(what, sizeof what, "all-gather of chunk %d", c->id);
    double t0 = pt_now_s();
    int rc = PT_OK;
    for (int r = 0; r < c->lc->n_regions && !rc; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        rc = pt_coll_allgather(st->env.coll, (char *)dst + g->offset, (size_t)c->sh->r[r].n,
                               pt_dtype_size(g->dtype), what, err, errlen);
        st->coll_b[1] += (double)g->bytes;
    }
    st->coll_s[1] += pt_now_s() - t0;
    return rc;
}

int pt_sh_grad_out(pt_store *st, cs_chunk *c, void *gbuf, char *err, size_t errlen) {
    const pt_gpu_backend *o = OPS(st);
    /* the host's backward of the chunk's blocks is done before the collective
     * reads the slot (the CPU on MPI, NCCL's own stream on cuda; a host
     * computing on its own thread is done already) */
    if (pt_cs_ord(st, PT_ORD_SHARD) && o->event_sync(IMPL(st), st->slot_used[c->slot]))
        return pt_fail(err, errlen, PT_ERR_BACKEND, "waiting for the backward of chunk %d "
                                                    "before its reduce-scatter failed: event_sync failed",
                       c->id);
    char what[64];
    snprintf(what, sizeof what, "reduce-scatter of chunk %d's gradient", c->id);
    double scale = 1.0 / st->world, t0 = pt_now_s();
    int rc = PT_OK;
    for (int r = 0; r < c->lc->n_regions && !rc; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (c->reg_state[r] == UINT64_MAX) continue;
        rc = pt_coll_reduce_scatter(st->env.coll, (char *)gbuf + g->offset, (size_t)c->sh->r[r].n,
                                    PT_COLL_F32, scale, what, err, errlen);
        st->coll_b[2] += (double)g->bytes;
    }
    st->coll_s[2] += pt_now_s() - t0;
    if (rc) return rc;
    const char *op = NULL;
    for (int r = 0; r < c->lc->n_regions && !op; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        const cs_shreg *q = &c->sh->r[r];
        if (c->reg_state[r] == UINT64_MAX || !q->own) continue;
        if (pt_gpu_memcpy_async(st->env.gpu, c->h_gstage + (size_t)q->st_sh * 4,
                                (char *)gbuf + g->offset + q->lo * 4, (size_t)q->own * 4,
                                PT_GPU_D2H, st->env.s_d2h))
            op = "memcpy";
    }
    if (!op && (o->event_record(IMPL(st), c->ev_d2h, st->env.s_d2h) ||
                o->event_record(IMPL(st), st->slot_free[c->slot], st->env.s_d2h)))
        op = "event_record";
    return op ? pt_fail(err, errlen, PT_ERR_BACKEND, "copy of this rank's part of chunk %d's "
                                                     "gradient to the host failed: %s failed",
                        c->id, op)
              : PT_OK;
}

/* acc (+)= stage over the parts (padding elements are zero on both sides). */
void pt_sh_accumulate(cs_chunk *c, int first) {
    for (int r = 0; r < c->lc->n_regions; r++) {
        const cs_shreg *q = &c->sh->r[r];
        if (q->st_sh == UINT64_MAX) continue;
        float *acc = c->h_gacc + q->st_sh;
        const float *src = (const float *)c->h_gstage + q->st_sh;
        if (first) memcpy(acc, src, (size_t)q->s * 4);
        else
            for (uint64_t e = 0; e < q->s; e++) acc[e] += src[e];
    }
}

void pt_sh_adam(cs_chunk *c, const pt_adamw_consts *k, int from_acc) {
    for (int r = 0; r < c->lc->n_regions; r++) {
        const cs_shreg *q = &c->sh->r[r];
        if (q->st_sh == UINT64_MAX || !q->own) continue;
        pt_cpu_adam_args a;
        memset(&a, 0, sizeof a);
        a.n = (size_t)q->own;
        a.c = *k;
        a.m = c->h_m + q->st_sh;
        a.v = c->h_v + q->st_sh;
        a.g = from_acc ? (const void *)(c->h_gacc + q->st_sh)
                       : (const void *)((const float *)c->h_gstage + q->st_sh);
        a.g_dtype = PT_F32;
        a.p = (float *)((char *)c->h_param + q->hp_off);
        pt_cpu_adam_range(&a, 0, a.n);
    }
}

/* Per param root: the squared norm of the elements in this rank's part (the
 * other ranks hold the rest; pt_sh_norm_reduce adds them up). */
void pt_sh_norms(pt_store *st, cs_chunk *c, int from_acc) {
    for (int j = 0; j < c->lc->n_params; j++) {
        int root = st->lay.order[c->lc->first_param + j];
        uint64_t off = st->lay.param_offset[root];
        uint64_t n = pt_store_param_numel(&st->env.model->params[root]);
        double sq = 0;
        for (int r = 0; r < c->lc->n_regions; r++) {
            const pt_chunk_region *g = &c->lc->regions[r];
            const cs_shreg *q = &c->sh->r[r];
            if (off < g->offset || off >= g->offset + g->bytes || q->st_sh == UINT64_MAX)
                continue;
            uint64_t e0 = (off - g->offset) / 4, a = e0 > q->lo ? e0 : q->lo;
            uint64_t b = e0 + n < q->lo + q->own ? e0 + n : q->lo + q->own;
            const float *x = (from_acc ? c->h_gacc : (const float *)c->h_gstage) + q->st_sh;
            for (uint64_t e = a; e < b; e++) sq += (double)x[e - q->lo] * x[e - q->lo];
        }
        st->psq[root] = sq;
    }
}

static int sharded_root(const pt_store *st, int i) {
    return st->root[i] == i && st->root_tr[i] && st->ch[st->lay.param_chunk[i]].sh;
}

int pt_sh_norm_reduce(pt_store *st, char *err, size_t errlen) {
    double *v = calloc((size_t)st->n_params, sizeof *v);
    if (!v) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    for (int i = 0; i < st->n_params; i++)
        if (sharded_root(st, i)) v[i] = st->psq[i];
    int rc = pt_coll_allreduce(st->env.coll, v, (size_t)st->n_params, PT_COLL_F64, 1.0,
                               "squared gradient norms", err, errlen);
    for (int i = 0; !rc && i < st->n_params; i++)
        if (sharded_root(st, i)) st->psq[i] = v[i];
    free(v);
    return rc;
}

int pt_sh_read_param(pt_store *st, cs_chunk *c, uint64_t off, void *dst, size_t bytes,
                     char *err, size_t errlen) {
    int rc = pt_cs_wait_task(st, c, "read_param", err, errlen);   /* its step is done */
    if (rc) return rc;
    char *full = calloc(1, (size_t)(c->used ? c->used : 1));
    if (!full) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "read_param: out of host memory");
    parts_xfer(c, full, c->h_param, 1);
    char what[64];
    snprintf(what, sizeof what, "all-gather of chunk %d for read_param", c->id);
    for (int r = 0; r < c->lc->n_regions && !rc; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        rc = pt_coll_allgather(st->env.coll, full + g->offset, (size_t)c->sh->r[r].n,
                               pt_dtype_size(g->dtype), what, err, errlen);
    }
    if (!rc) memcpy(dst, full + off, bytes);
    free(full);
    return rc;
}

/* ---- full-chunk views for state images ---- */

static void view_free(cs_chunk *c, void *p, float *m, float *v) {
    (void)c;
    free(p);
    free(m);
    free(v);
}

void pt_sh_views_close(pt_store *st, int scatter) {
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        cs_shard *h = c->sh;
        if (!h || !h->keep_param) continue;
        for (int r = 0; scatter && r < c->lc->n_regions; r++) {
            const cs_shreg *q = &h->r[r];
            if (q->st_sh == UINT64_MAX || !q->own) continue;
            memcpy(h->keep_m + q->st_sh, c->h_m + q->st_full + q->lo, (size_t)q->own * 4);
            memcpy(h->keep_v + q->st_sh, c->h_v + q->st_full + q->lo, (size_t)q->own * 4);
        }
        if (scatter) parts_xfer(c, c->h_param, h->keep_param, 0);
        view_free(c, c->h_param, c->trainable ? c->h_m : NULL, c->trainable ? c->h_v : NULL);
        c->h_param = h->keep_param;
        if (c->trainable) {
            c->h_m = h->keep_m;
            c->h_v = h->keep_v;
        }
        for (int r = 0; r < c->lc->n_regions; r++) c->reg_state[r] = h->r[r].st_sh;
        h->keep_param = NULL;
        h->keep_m = h->keep_v = NULL;
    }
}

int pt_sh_views_open(pt_store *st, int gather, char *err, size_t errlen) {
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        cs_shard *h = c->sh;
        if (!h) continue;
        char *full = calloc(1, (size_t)(c->used ? c->used : 1));
        float *fm = c->trainable ? calloc((size_t)h->n_state_full + 1, 4) : NULL;
        float *fv = c->trainable ? calloc((size_t)h->n_state_full + 1, 4) : NULL;
        int rc = (!full || (c->trainable && (!fm || !fv)))
                     ? pt_fail(err, errlen, PT_ERR_HOST_OOM,
                               "state: out of host memory for chunk %d's full view", c->id)
                     : PT_OK;
        if (!rc) parts_xfer(c, full, c->h_param, 1);
        char what[64];
        snprintf(what, sizeof what, "all-gather of chunk %d's state", c->id);
        for (int r = 0; !rc && r < c->lc->n_regions; r++) {
            const pt_chunk_region *g = &c->lc->regions[r];
            const cs_shreg *q = &h->r[r];
            if (gather)
                rc = pt_coll_allgather(st->env.coll, full + g->offset, (size_t)q->n,
                                       pt_dtype_size(g->dtype), what, err, errlen);
            if (rc || q->st_sh == UINT64_MAX) continue;
            if (q->own) {
                memcpy(fm + q->st_full + q->lo, c->h_m + q->st_sh, (size_t)q->own * 4);
                memcpy(fv + q->st_full + q->lo, c->h_v + q->st_sh, (size_t)q->own * 4);
            }
            if (gather && !(rc = pt_coll_allgather(st->env.coll, fm + q->st_full, (size_t)q->n, 4,
                                                   what, err, errlen)))
                rc = pt_coll_allgather(st->env.coll, fv + q->st_full, (size_t)q->n, 4, what, err,
                                       errlen);
        }
        if (rc) {
            view_free(c, full, fm, fv);
            pt_sh_views_close(st, 0);
            return rc;
        }
        h->keep_param = c->h_param;
        c->h_param = full;
        if (c->trainable) {
            h->keep_m = c->h_m;
            h->keep_v = c->h_v;
            c->h_m = fm;
            c->h_v = fv;
        }
        for (int r = 0; r < c->lc->n_regions; r++) c->reg_state[r] = h->r[r].st_full;
    }
    return PT_OK;
}
