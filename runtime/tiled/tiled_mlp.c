/*
 * tiled_mlp.c — TiledMLP: a block's MLP run in sequence tiles so that only one
 * tile's (rows, 4C)-sized intermediates exist at a time.
 *
 * The plugin drives the tiles; the host computes one tile per callback:
 *   forward:  for each tile: host mlp_forward(b, begin, count)
 *   backward: for each tile: host mlp_forward (recompute into the tile scratch),
 *             then host mlp_backward (input-gradient rows, weight gradients +=)
 * Tiles are explicit (base.h pt_mlp_tile_len): c = ceil(tokens/N) rows each, the
 * last one shorter, N_eff = ceil(tokens/c) of them, so no tile is empty and the
 * loop ends on the row count, never on a comparison with N.
 *
 * Weight gradients: for the tile loop the block's gradient pointers are pointed
 * at one zeroed fp32 accumulator (block's trainable fp32 params, their sizes), so
 * every tile adds into it with scale 1 (tiles partition the tokens and the loss is
 * a sum over tokens: per-tile gradients add, they are not averaged). After the
 * last tile the real pointers come back and the sum is added into the gradient
 * once (g = g + sum): the store sees one contribution per layer per backward and,
 * with accumulation, the result is G0 + dW. The add is the backend's convert op
 * with accumulate (fp32 into fp32: g[k] = g[k] + sum[k], one fp32 addition per
 * element), queued on the compute stream, so it runs on the device on every
 * backend and orders after the tiles' kernels and before the store's reads.
 */
#include <stdlib.h>

#include "device_ext.h"
#include "planner/planner.h"
#include "tiled_internal.h"

int pt_tiled_check(pt_rt *rt, char *err, size_t errlen) {
    if (!rt->cfg.tiled_mlp_enabled) return PT_OK;
    if (!rt->host.mlp_forward || !rt->host.mlp_backward)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[tiled_mlp] enabled = true, but the host gives no mlp_forward / "
                       "mlp_backward callbacks in pt_host_v1 (config %s)", rt->cfg.source);
    const pt_model_v1 *m = rt->model;
    for (int i = 0; i < m->n_params; i++) {
        const pt_param_v1 *p = &m->params[i];
        if (p->block >= 0 && p->trainable && p->tie < 0 && p->dtype != PT_F32)
            return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                           "[tiled_mlp] enabled = true: parameter %d (%s) is not fp32; the tile "
                           "gradient sum is built for fp32 gradients only", i,
                           p->name ? p->name : "?");
    }
    return PT_OK;
}

int64_t pt_tiled_tiles_req(const pt_rt *rt) {
    const pt_tiled_state *s = tiled_of(rt);
    return rt->cfg.tiled_mlp_tiles > 0 ? rt->cfg.tiled_mlp_tiles : s ? s->mlp_auto_n : 0;
}

uint64_t pt_tiled_mlp_tiles(const pt_rt *rt) {
    if (!rt->cfg.tiled_mlp_enabled) return 0;
    if (!rt->model) return rt->cfg.tiled_mlp_tiles > 0 ? (uint64_t)rt->cfg.tiled_mlp_tiles : 1;
    return (uint64_t)pt_mlp_tiles_eff(rt->model->batch * rt->model->seq, pt_tiled_tiles_req(rt));
}

/* tiles = auto. The profile ran with tiles of c0 = PT_MLP_AUTO_TILE rows (or fewer
 * rows in all): its windows hold the tile scratch of c0 rows. A count with longer
 * tiles c > c0 needs (c - c0) * (scratch bytes per row) more in each block's
 * forward and backward window; adding that to the window's measured high-water
 * mark is an upper bound (the peak may have been elsewhere in the window), so a
 * plan the adjusted profile fits does fit. Candidates go from 1 tile up, one per
 * distinct tile length; the last is the profiled count itself, unadjusted. */
int pt_tiled_auto_search(pt_rt *rt, const pt_trace *t, double prof_s, char *err,
                            size_t errlen) {
    pt_tiled_state *s = tiled_of(rt);
    if (!s)
        return pt_fail(err, errlen, PT_ERR_ORDER, "[tiled_mlp] tiles = auto: searched before "
                       "post_model_load");
    int64_t tok = rt->model->batch * rt->model->seq;
    int64_t n0 = pt_mlp_tiles_eff(tok, 0), c0 = pt_mlp_tile_len(tok, 0);
    pt_trace a;
    pt_trace_init(&a);
    int rc = PT_ERR_INFEASIBLE;
    int64_t prev_c = 0;
    for (int64_t n = 1; n < n0; n++) {
        int64_t c = pt_mlp_tile_len(tok, n);
        if (c == prev_c || c <= c0) continue;
        prev_c = c;
        if ((rc = pt_trace_copy(&a, t, err, errlen))) break;
        for (int b = 0; b < a.n_block; b++) {
            a.blocks[b].fwd_scratch_bytes += (uint64_t)(c - c0) * s->tile_tok[0];
            a.blocks[b].bwd_scratch_bytes += (uint64_t)(c - c0) * s->tile_tok[1];
        }
        s->mlp_auto_n = n;
        rc = pt_rt_search_and_apply(rt, &a, prof_s, err, errlen);
        if (rc != PT_ERR_INFEASIBLE) break;
        PT_LOGI(&rt->lg, "[tiled_mlp] tiles = auto: %lld tiles of %lld tokens do not fit; trying "
                "more", (long long)n, (long long)c);
    }
    pt_trace_free(&a);
    if (rc == PT_ERR_INFEASIBLE) {
        s->mlp_auto_n = n0;
        rc = pt_rt_search_and_apply(rt, t, prof_s, err, errlen);
    }
    if (rc == PT_OK)
        PT_LOGI(&rt->lg, "[tiled_mlp] tiles = auto: %lld tiles of %lld tokens, the fewest whose "
                "plan fits", (long long)s->mlp_auto_n,
                (long long)pt_mlp_tile_len(tok, s->mlp_auto_n));
    return rc;
}

int pt_tiled_scratch(pt_rt *rt, uint64_t bytes, void **ptr, char *err, size_t errlen) {
    if (!ptr) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "tiled_mlp_scratch: ptr is NULL");
    *ptr = NULL;
    pt_tiled_state *s = tiled_of(rt);
    if (!s || !s->in_tiles)
        return pt_fail(err, errlen, PT_ERR_ORDER,
                       "tiled_mlp_scratch called outside the host's mlp_forward / mlp_backward "
                       "callbacks");
    if (bytes == 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "tiled_mlp_scratch: zero bytes requested");
    if (bytes > s->tile_scr_bytes) {
        /* a larger request than the first tile's: replace (the old one's queued users
         * finish first, the free is in the stream's order) */
        if (s->tile_scr) {
            int rc = pt_gpu_free_on_stream(rt->dev.gpu, s->tile_scr, rt->dev.s_compute, err, errlen);
            s->tile_scr = NULL;
            s->tile_scr_bytes = 0;
            if (rc) return rc;
        }
        int rc = pt_gpu_alloc(rt->dev.gpu, (size_t)bytes, PT_TAG_SCRATCH, &s->tile_scr, err, errlen);
        if (rc) {
            s->tile_scr = NULL;
            return rc;
        }
        s->tile_scr_bytes = bytes;
    }
    /* device bytes per row (the allocator's rounding included) for tiles = auto */
    uint64_t fp = pt_gpu_alloc_size(rt->dev.gpu, s->tile_scr), cnt = (uint64_t)s->tile_count;
    uint64_t per = cnt ? (fp + cnt - 1) / cnt : fp;
    if (per > s->tile_tok[s->tile_bwd]) s->tile_tok[s->tile_bwd] = per;
    *ptr = s->tile_scr;
    return PT_OK;
}

static size_t numel(const pt_param_v1 *p) {
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (size_t)p->shape[d];
    return n;
}

static int tgrad(const pt_param_v1 *p, int32_t b) {
    return p->block == b && p->trainable && p->tie < 0 && p->grad;
}

int pt_tiled_mlp(pt_rt *rt, int32_t b, int64_t tokens, int backward, char *err,
                    size_t errlen) {
    const char *hook = backward ? "tiled_mlp_backward" : "tiled_mlp_forward";
    if (!rt->cfg.tiled_mlp_enabled)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "%s: [tiled_mlp] enabled = false in %s", hook, rt->cfg.source);
    if (!rt->model || b < 0 || b >= rt->n_blocks || tokens < 1)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "%s(block %d, tokens %lld): bad block "
                       "or token count", hook, (int)b, (long long)tokens);
    pt_tiled_state *s = tiled_of(rt);
    if (!s)
        return pt_fail(err, errlen, PT_ERR_ORDER, "%s called before post_model_load", hook);
    if (s->in_tiles)
        return pt_fail(err, errlen, PT_ERR_ORDER, "%s called from inside a tile callback", hook);
    pt_model_v1 *m = rt->model;
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    void *impl = pt_gpu_impl(rt->dev.gpu);
    int64_t c = pt_mlp_tile_len(tokens, pt_tiled_tiles_req(rt));
    int rc = PT_OK;

    /* backward: the block's trainable gradients -> one zeroed fp32 accumulator,
     * (sum of the block's gradient sizes) floats */
    void **saved = NULL;
    float *acc = NULL;
    size_t acc_n = 0;
    if (backward) {
        for (int i = 0; i < m->n_params; i++)
            if (tgrad(&m->params[i], b)) acc_n += numel(&m->params[i]);
        if (acc_n) {
            saved = calloc((size_t)m->n_params, sizeof *saved);
            if (!saved)
                return pt_fail(err, errlen, PT_ERR_HOST_OOM, "%s: out of host memory", hook);
            void *p = NULL;
            rc = pt_gpu_alloc(rt->dev.gpu, acc_n * sizeof(float), PT_TAG_SCRATCH, &p, err, errlen);
            if (rc) {
                free(saved);
                return rc;
            }
            acc = p;
            if (ops->memset_async(impl, acc, 0, acc_n * sizeof(float), rt->dev.s_compute)) {
                pt_gpu_free(rt->dev.gpu, acc);
                free(saved);
                return pt_fail(err, errlen, PT_ERR_BACKEND, "%s: zeroing the gradient "
                               "accumulator failed", hook);
            }
            size_t off = 0;
            for (int i = 0; i < m->n_params; i++) {
                pt_param_v1 *p = &m->params[i];
                if (!tgrad(p, b)) continue;
                saved[i] = p->grad;
                p->grad = acc + off;
                off += numel(p);
            }
        }
    }

    s->in_tiles = 1;
    for (int64_t begin = 0; begin < tokens && !rc; begin += c) {
        int64_t count = tokens - begin < c ? tokens - begin : c;
        s->tile_count = count;
        s->tile_bwd = backward;
        int32_t st = rt->host.mlp_forward(rt->host.user, b, begin, count);
        const char *cb = "mlp_forward";
        if (!st && backward) {
            st = rt->host.mlp_backward(rt->host.user, b, begin, count);
            cb = "mlp_backward";
        }
        if (st)
            rc = pt_fail(err, errlen, PT_ERR_CALLBACK, "%s(%d): the host's %s(%d, %lld, %lld) "
                         "returned %d", hook, (int)b, cb, (int)b, (long long)begin,
                         (long long)count, (int)st);
    }
    s->in_tiles = 0;

    if (s->tile_scr) {
        char e2[256];
        int r2 = pt_gpu_free_on_stream(rt->dev.gpu, s->tile_scr, rt->dev.s_compute, e2, sizeof e2);
        if (r2 && !rc) rc = pt_fail(err, errlen, r2, "%s: %s", hook, e2);
        s->tile_scr = NULL;
        s->tile_scr_bytes = 0;
    }
    if (acc) {
        size_t off = 0;
        for (int i = 0; i < m->n_params; i++) {
            pt_param_v1 *p = &m->params[i];
            if (p->block != b || !saved[i]) continue;
            p->grad = saved[i];   /* the real gradient comes back even on failure */
            /* after the tiles' queued work, before the store's later reads of the
             * gradient (its copies wait on the compute stream) */
            if (!rc && ops->convert(impl, saved[i], PT_F32, acc + off, PT_F32, numel(p), 1,
                                    rt->dev.s_compute))
                rc = pt_fail(err, errlen, PT_ERR_BACKEND, "%s: the gradient add (convert with "
                             "accumulate) of parameter %d failed", hook, i);
            off += numel(p);
        }
        free(saved);
        char e2[256];
        int r2 = pt_gpu_free_on_stream(rt->dev.gpu, acc, rt->dev.s_compute, e2, sizeof e2);
        if (r2 && !rc) rc = pt_fail(err, errlen, r2, "%s: %s", hook, e2);
    }
    /* a host without PT_HOST_ASYNC_COMPUTE expects the plugin's work done on return */
    if (!rc && !rt->dev.host_async && ops->stream_sync(impl, rt->dev.s_compute))
        rc = pt_fail(err, errlen, PT_ERR_BACKEND, "%s: device stream sync failed", hook);
    return rc;
}
