/*
 * param_access.c — one parameter of the store as the host and the features
 * see it: its values read back (read_param) and written (write_param), where its fp32 copy lives
 * (resident, pinned, or mode C's part) and which chunk holds it.
 */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

int pt_store_read_param(pt_store *st, int32_t index, void *dst, uint64_t bytes, char *err,
                        size_t errlen) {
    pt_store *ms = st;
    if (!ms || index < 0 || index >= ms->n_params || !dst) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "read_param: bad index %d (model has %d params) or NULL destination", index,
                       ms ? ms->n_params : 0);
    }
    int root = ms->root[index];
    const pt_param_v1 *p = &st->env.model->params[root];
    uint64_t need = pt_store_param_numel(p) * pt_dtype_size(p->dtype);
    if (bytes != need) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "read_param: param %d holds %llu bytes, caller passed %llu", index,
                       (unsigned long long)need, (unsigned long long)bytes);
    }
    cs_chunk *c = &ms->ch[ms->lay.param_chunk[root]];
    uint64_t off = ms->lay.param_offset[root];
    if (c->sh) return pt_sh_read_param(st, c, off, dst, (size_t)bytes, err, errlen);
    if (c->persistent) {
        /* the last step's device optimizer step may still be queued */
        int rc = pt_cs_ord(st, PT_ORD_STEP) ? pt_store_sync(st, err, errlen) : PT_OK;
        char e[256];
        if (!rc && (rc = pt_gpu_memcpy_sync(st->env.gpu, dst, (char *)c->d_param + off, bytes,
                                            PT_GPU_D2H, e, sizeof e)))
            rc = pt_fail(err, errlen, PT_ERR_BACKEND, "read_param: reading param %d failed: %s",
                         index, e);
        return rc;
    }
    int rc = pt_cs_wait_task(st, c, "read_param", err, errlen);
    if (rc) return rc;
    /* a whole image on the disk tier: through a view of its record */
    if (c->tiered == 2 && (rc = pt_tier_chunk_open(st, c, 1, err, errlen))) return rc;
    memcpy(dst, (char *)c->h_param + off, bytes);
    return c->tiered == 2 ? pt_tier_chunk_close(st, c, 0, err, errlen) : PT_OK;
}

/* The fp32 state index of root param `root` in chunk c (its master, m, v), or
 * UINT64_MAX when it has no optimizer state. */
static uint64_t state_index(const pt_store *st, const cs_chunk *c, int root) {
    uint64_t off = st->lay.param_offset[root];
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (off >= g->offset && off < g->offset + g->bytes && c->reg_state[r] != UINT64_MAX)
            return c->reg_state[r] + (off - g->offset) / pt_dtype_size(g->dtype);
    }
    return UINT64_MAX;
}

int pt_store_write_param(pt_store *st, int32_t index, const void *src, uint64_t bytes,
                         char *err, size_t errlen) {
    if (!st || index < 0 || index >= st->n_params || !src)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "write_param: bad index %d (model has "
                                                        "%d params) or NULL source",
                       index, st ? st->n_params : 0);
    int root = st->root[index];
    const pt_param_v1 *p = &st->env.model->params[root];
    const char *name = p->name ? p->name : "(unnamed)";
    uint64_t n = pt_store_param_numel(p), need = n * pt_dtype_size(p->dtype);
    if (bytes != need)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "write_param: param %d holds %llu bytes, "
                                                        "caller passed %llu",
                       index, (unsigned long long)need,
                       (unsigned long long)bytes);
    cs_chunk *c = &st->ch[st->lay.param_chunk[root]];
    uint64_t off = st->lay.param_offset[root];
    if (c->sh)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "write_param: param %d '%s' lies in "
                                                        "chunk %d, which mode C splits across the ranks; writing a split "
                                                        "parameter is not built (load the weights before post_model_load, or "
                                                        "through load_state)",
                       index, name, c->id);
    /* nothing queued or running may still read or write the chunk */
    int rc = c->persistent ? pt_store_sync(st, err, errlen)
                           : pt_cs_wait_task(st, c, "write_param", err, errlen);
    if (rc) return rc;
    uint64_t s = st->opt_ready && st->root_tr[root] ? state_index(st, c, root) : UINT64_MAX;
    float *wide = NULL;   /* a 16-bit value widened: its fp32 master */
    if (s != UINT64_MAX && p->dtype != PT_F32) {
        if (!(wide = malloc(sizeof(float) * (size_t)(n ? n : 1))))
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "write_param: out of host memory");
        pt_cpu_cvt(wide, PT_F32, src, p->dtype, (size_t)n);
    }
    char e[256] = "";
    if (c->persistent) {
        if (pt_gpu_memcpy_sync(st->env.gpu, (char *)c->d_param + off, src, (size_t)bytes,
                               PT_GPU_H2D, e, sizeof e) ||
            (wide && pt_gpu_memcpy_sync(st->env.gpu, c->d_master + s, wide, sizeof(float) * n,
                                        PT_GPU_H2D, e, sizeof e)))
            rc = pt_fail(err, errlen, PT_ERR_BACKEND, "write_param: writing param %d failed: %s",
                         index, e);
    } else {
        /* a tiered chunk's master (level 2: the whole chunk) is in the tier's
         * file: through a view */
        int tv = (wide && c->tiered) || c->tiered == 2;
        if (!(tv && (rc = pt_tier_chunk_open(st, c, 1, err, errlen)))) {
            memcpy((char *)c->h_param + off, src, (size_t)bytes);
            if (wide) memcpy(c->h_master + s, wide, sizeof(float) * n);
            if (tv) rc = pt_tier_chunk_close(st, c, 1, err, errlen);
        }
        /* a streamed copy in a buffer slot holds the old value: untag it */
        if (st->pool) pt_bufpool_invalidate(st->pool, c->id, NULL, 0);
    }
    free(wide);
    return rc;
}

int pt_store_param_home(pt_store *st, int32_t index, float **p, int *on_device, char *err,
                        size_t errlen) {
    pt_store *ms = st;
    *p = NULL;
    if (!ms || index < 0 || index >= ms->n_params)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "param_home: bad index %d (model has %d "
                                                        "params)",
                       index, ms ? ms->n_params : 0);
    int root = ms->root[index];
    const pt_param_v1 *q = &st->env.model->params[root];
    if (q->dtype != PT_F32)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "param_home: param %d '%s' is not fp32",
                       index, q->name ? q->name : "(unnamed)");
    cs_chunk *c = &ms->ch[ms->lay.param_chunk[root]];
    uint64_t off = ms->lay.param_offset[root];
    if (c->sh)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "param_home: param %d '%s' lies in "
                                                        "chunk %d, which mode C splits across the ranks",
                       index,
                       q->name ? q->name : "(unnamed)", c->id);
    if (c->persistent) {
        *p = (float *)((char *)c->d_param + off);
        *on_device = 1;
        return PT_OK;
    }
    if (c->tiered == 2)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "param_home: param %d '%s' lies in "
                                                        "chunk %d, whose whole image is on the disk tier ([nvme]): it has "
                                                        "no fixed host copy (raise [memory] pinned_budget)",
                       index, q->name ? q->name : "(unnamed)", c->id);
    int rc = pt_cs_wait_task(st, c, "param_home", err, errlen);
    if (rc) return rc;
    *p = (float *)((char *)c->h_param + off);
    *on_device = 0;
    return PT_OK;
}

int pt_store_param_part(pt_store *st, int32_t index, pt_store_part *out, char *err,
                        size_t errlen) {
    memset(out, 0, sizeof *out);
    if (!st || index < 0 || index >= st->n_params)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "param_part: bad index %d (model has %d "
                                                        "params)",
                       index, st ? st->n_params : 0);
    int root = st->root[index];
    cs_chunk *c = &st->ch[st->lay.param_chunk[root]];
    const pt_param_v1 *q = &st->env.model->params[root];
    uint64_t n = pt_store_param_numel(q);
    if (!c->sh) {
        out->len = n;
        return pt_store_param_home(st, index, &out->p, &out->on_device, err, errlen);
    }
    if (q->dtype != PT_F32)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "param_part: param %d '%s' is not fp32",
                       index, q->name ? q->name : "(unnamed)");
    int rc = pt_cs_wait_task(st, c, "param_part", err, errlen);
    if (rc) return rc;
    out->split = 1;
    /* the param is elements [e0, e0 + n) of one region; this rank owns the
     * region's [lo, lo + own): the intersection is contiguous */
    uint64_t off = st->lay.param_offset[root];
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        const cs_shreg *h = &c->sh->r[r];
        if (off < g->offset || off >= g->offset + g->bytes) continue;
        uint64_t e0 = (off - g->offset) / 4, a = e0 > h->lo ? e0 : h->lo;
        uint64_t b = e0 + n < h->lo + h->own ? e0 + n : h->lo + h->own;
        if (b > a) {
            out->p = (float *)((char *)c->h_param + h->hp_off) + (a - h->lo);
            out->lo = a - e0;
            out->len = b - a;
        }
        break;
    }
    return PT_OK;
}

int pt_store_param_parts(const pt_store *st, int32_t index, size_t *lo, size_t *len) {
    if (!st || index < 0 || index >= st->n_params) return -1;
    int root = st->root[index];
    const cs_chunk *c = &st->ch[st->lay.param_chunk[root]];
    if (!c->sh) return -1;
    const pt_param_v1 *q = &st->env.model->params[root];
    uint64_t off = st->lay.param_offset[root], es = pt_dtype_size(q->dtype);
    uint64_t n = pt_store_param_numel(q);
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (off < g->offset || off >= g->offset + g->bytes) continue;
        /* the region's parts (pt_coll_part over its elements) cut to the param's
         * elements [e0, e0 + n) */
        uint64_t e0 = (off - g->offset) / es;
        for (int p = 0; p < st->world; p++) {
            size_t plo, plen;
            pt_coll_part((size_t)c->sh->r[r].n, st->world, p, &plo, &plen);
            uint64_t a = e0 > plo ? e0 : plo, b = e0 + n < plo + plen ? e0 + n : plo + plen;
            lo[p] = b > a ? (size_t)(a - e0) : 0;
            len[p] = b > a ? (size_t)(b - a) : 0;
        }
        return 0;
    }
    return -1;
}

int pt_store_param_chunk(const pt_store *st, int32_t index, float **pinned) {
    *pinned = NULL;
    if (!st || index < 0 || index >= st->n_params) return -1;
    int root = st->root[index];
    const cs_chunk *c = &st->ch[st->lay.param_chunk[root]];
    if (!c->persistent && !c->sh && c->tiered != 2 && st->env.model->params[root].dtype == PT_F32)
        *pinned = (float *)((char *)c->h_param + st->lay.param_offset[root]);
    return c->id;
}
