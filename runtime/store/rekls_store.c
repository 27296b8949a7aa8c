/*
 * rekls_store.c — REKLS inside the chunk store.
 *
 * Which parameters: every trainable 2-D parameter owned by a block, with no
 * tie, and both sides at most PT_REKLS_MAX_DIM. Everything else keeps AdamW:
 * biases and norm gains (not 2-D), and the non-block parameters (token and
 * position embeddings, the final norm, an untied head) — an embedding's
 * vocabulary side would need a vocab x vocab factor (50257^2 fp32 = 10 GB for
 * GPT-2) and an eigendecomposition of it every step. The rule is logged with
 * the counts at create_optimizer.
 *
 * State: a REKLS param's first and second moments live in its chunk's Adam
 * m / v slots (same size, m x n), in eigen coordinates; its factors, bases and
 * eigenvalues (pt_rekls_aux_words) in the chunk's rk_aux block, on the device
 * for resident chunks and in host memory for offloaded ones. Resident chunks
 * step through the backend's ops on the compute stream, in one device scratch
 * sized for the largest resident REKLS param; offloaded chunks on the CPU
 * optimizer's worker that steps the chunk, in a scratch of its own. Both run
 * pt_rekls_step with the same arguments: the same bits on the host backend.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_hd.h"
#include "store_internal.h"

static int eligible(const pt_store *st, int i) {
    const pt_model_v1 *m = st->env.model;
    const pt_param_v1 *p = &m->params[i];
    if (st->root[i] != i || !p->trainable || p->ndim != 2 || p->block < 0 || p->tie >= 0)
        return 0;
    if (p->shape[0] < 1 || p->shape[1] < 1 || p->shape[0] > PT_REKLS_MAX_DIM ||
        p->shape[1] > PT_REKLS_MAX_DIM)
        return 0;
    for (int j = 0; j < m->n_params; j++)   /* something shares its storage */
        if (j != i && st->root[j] == i) return 0;
    return 1;
}

/* fp32 state index of root i (its region's state offset + element offset). */
static uint64_t state_index(const pt_store *st, const cs_chunk *c, uint64_t off) {
    (void)st;
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (off >= g->offset && off < g->offset + g->bytes && c->reg_state[r] != UINT64_MAX)
            return c->reg_state[r] + (off - g->offset) / pt_dtype_size(g->dtype);
    }
    return UINT64_MAX;
}

/* REKLS is the optimizer to plan for: the one create_optimizer chose, or
 * before that the INI's (a host descriptor asking for REKLS under an INI that
 * says adamw is planned without its factors; the store allocates them anyway). */
static int planned(const pt_store *st) {
    int t = st->env.opt ? st->env.opt->type : 0;
    return t ? t == PT_OPTIM_REKLS : st->env.cfg->optim_type == PT_OPTIM_REKLS;
}

void pt_rk_plan_chunk(pt_store *st, cs_chunk *c) {
    c->rk_plan_aux = c->rk_plan_ws = 0;
    c->rk_plan_gemm = c->rk_plan_eigh = 0;
    c->rk_plan_n = 0;
    if (!planned(st) || !c->trainable) return;
    const pt_model_v1 *m = st->env.model;
    for (int j = 0; j < c->lc->n_params; j++) {
        int i = st->lay.order[c->lc->first_param + j];
        if (!eligible(st, i)) continue;
        uint64_t a = (uint64_t)m->params[i].shape[0], b = (uint64_t)m->params[i].shape[1];
        c->rk_plan_aux += pt_rekls_aux_words(a, b);
        c->rk_plan_gemm += pt_rekls_gemm_flops(a, b);
        c->rk_plan_eigh += pt_rekls_eigh_flops(a, b);
        c->rk_plan_n++;
        uint64_t w = pt_rekls_ws_words(a, b);
        if (w > c->rk_plan_ws) c->rk_plan_ws = w;
    }
}

int pt_rk_init(pt_store *st, char *err, size_t errlen) {
    pt_model_v1 *m = st->env.model;
    st->rk_of = malloc(sizeof(int) * (size_t)m->n_params);
    st->rk = calloc((size_t)m->n_params, sizeof *st->rk);
    if (!st->rk_of || !st->rk) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    for (int i = 0; i < m->n_params; i++) st->rk_of[i] = -1;
    uint64_t ws_max = 0, words = 0;
    int n_adam = 0;
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        c->rk_first = st->n_rk;
        for (int j = 0; c->trainable && j < c->lc->n_params; j++) {
            int i = st->lay.order[c->lc->first_param + j];
            if (!eligible(st, i)) {
                n_adam += st->root[i] == i && m->params[i].trainable;
                continue;
            }
            rk_param *q = &st->rk[st->n_rk];
            q->param = i;
            q->chunk = k;
            q->m = (int)m->params[i].shape[0];
            q->n = (int)m->params[i].shape[1];
            q->off = st->lay.param_offset[i];
            q->s = state_index(st, c, q->off);
            if (q->s == UINT64_MAX)
                return pt_fail(err, errlen, PT_ERR_INTERNAL,
                               "REKLS: trainable parameter '%s' has no optimizer state slot",
                               m->params[i].name);
            q->aux = c->rk_aux_words;
            c->rk_aux_words += pt_rekls_aux_words((uint64_t)q->m, (uint64_t)q->n);
            st->rk_of[i] = st->n_rk++;
            uint64_t w = pt_rekls_ws_words((uint64_t)q->m, (uint64_t)q->n);
            if (c->persistent && w > ws_max) ws_max = w;
        }
        c->rk_count = st->n_rk - c->rk_first;
        if (!c->rk_count) continue;
        words += c->rk_aux_words;
        /* zero factors, identity bases: built on the host, copied in */
        float *img = malloc(sizeof(float) * (size_t)c->rk_aux_words);
        if (!img) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
        for (int r = c->rk_first; r < st->n_rk; r++)
            pt_rekls_aux_init_host(img + st->rk[r].aux, st->rk[r].m, st->rk[r].n);
        int rc = PT_OK;
        size_t bytes = sizeof(float) * (size_t)c->rk_aux_words;
        if (c->persistent) {
            rc = pt_gpu_alloc(st->env.gpu, bytes, PT_TAG_OPTIM, (void **)&c->rk_aux, err, errlen);
            if (!rc && pt_gpu_memcpy(st->env.gpu, c->rk_aux, img, bytes, PT_GPU_H2D))
                rc = pt_fail(err, errlen, PT_ERR_BACKEND,
                             "REKLS: copying chunk %d's initial factors to the device failed", k);
            free(img);
        } else {   /* pinned, like the chunk's moments: the host budget counts it */
            rc = pt_gpu_pinned_alloc(st->env.gpu, bytes, (void **)&c->rk_aux, err, errlen);
            if (!rc) memcpy(c->rk_aux, img, bytes);
            free(img);
        }
        if (rc) return rc;
    }
    if (ws_max) {
        int rc = pt_gpu_alloc(st->env.gpu, sizeof(float) * (size_t)ws_max, PT_TAG_OPTIM,
                              (void **)&st->d_rk_ws, err, errlen);
        if (!rc) rc = pt_gpu_alloc(st->env.gpu, sizeof(int), PT_TAG_OTHER,
                                   (void **)&st->d_rk_status, err, errlen);
        if (rc) return rc;
        pt_rekls_dev d = {pt_gpu_ops(st->env.gpu), pt_gpu_impl(st->env.gpu), st->env.s_compute,
                          st->d_rk_status};
        pt_rekls_la la;
        if ((rc = pt_rekls_la_device(&d, &la, err, errlen))) return rc;
    }
    PT_LOGI(st->env.lg,
            "REKLS on %d 2-D block parameter(s) (%.1f MiB of factors and bases beyond the Adam "
            "moments); AdamW on the other %d trainable parameter(s): not 2-D, outside blocks "
            "(embeddings, final norm, head), tied, or a side above %d", st->n_rk,
            (double)words * 4 / 1048576.0, n_adam, PT_REKLS_MAX_DIM);
    return PT_OK;
}

void pt_rk_fini(pt_store *st) {
    for (int k = 0; st->ch && k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        if (!c->rk_aux) continue;
        if (c->persistent) pt_gpu_free(st->env.gpu, c->rk_aux);
        else pt_gpu_pinned_free(st->env.gpu, c->rk_aux);
        c->rk_aux = NULL;
    }
    pt_gpu_free(st->env.gpu, st->d_rk_ws);
    pt_gpu_free(st->env.gpu, st->d_rk_status);
    st->d_rk_ws = NULL;
    st->d_rk_status = NULL;
    free(st->rk);
    free(st->rk_of);
    st->rk = NULL;
    st->rk_of = NULL;
    st->n_rk = 0;
}

static pt_rekls_hyper hyper(const pt_store *st, float lr, float gs, int64_t step) {
    const pt_optim_state *o = st->env.opt;
    const pt_config *c = st->env.cfg;
    pt_rekls_hyper h;
    h.lr = lr;
    h.beta1 = o->beta1;
    h.beta2 = o->beta2;
    h.eps = c->rekls_eps;
    h.weight_decay = o->weight_decay;
    h.shampoo_beta = c->rekls_shampoo_beta;
    h.seed_shampoo = c->rekls_seed_shampoo;
    h.k = step;
    h.grad_scale = gs;
    return h;
}

/* The chunk's params in layout order: REKLS ones by pt_rekls_step, the others
 * by AdamW over their own elements. Runs on a worker. */
void pt_rk_cpu_chunk(pt_store *st, cs_chunk *c, const pt_adamw_consts *k, int from_acc, float lr,
                     float gs, int64_t step) {
    pt_model_v1 *m = st->env.model;
    pt_rekls_hyper h = hyper(st, lr, gs, step);
    for (int j = 0; j < c->lc->n_params; j++) {
        int i = st->lay.order[c->lc->first_param + j];
        const pt_param_v1 *p = &m->params[i];
        if (st->root[i] != i || !st->root_tr[i]) continue;
        uint64_t off = st->lay.param_offset[i], s = state_index(st, c, off);
        if (s == UINT64_MAX) continue;
        size_t n = (size_t)pt_param_numel(p);
        const void *g = from_acc ? (const void *)(c->h_gacc + s) : (char *)c->h_gstage + off;
        int gdt = from_acc ? PT_F32 : p->dtype;
        float *param = p->dtype == PT_F32 ? (float *)((char *)c->h_param + off) : c->h_master + s;
        void *out = p->dtype == PT_F32 ? NULL : (char *)c->h_param + off;
        int r = st->rk_of[i];
        if (r < 0) {
            pt_cpu_adam_args a;
            memset(&a, 0, sizeof a);
            a.n = n;
            a.c = *k;
            a.m = c->h_m + s;
            a.v = c->h_v + s;
            a.g = g;
            a.g_dtype = gdt;
            a.p = param;
            a.out = out;
            a.out_dtype = p->dtype;
            pt_cpu_adam_range(&a, 0, n);
            continue;
        }
        const rk_param *q = &st->rk[r];
        float *ws = malloc(sizeof(float) * (size_t)pt_rekls_ws_words((uint64_t)q->m, (uint64_t)q->n));
        char e[256];
        int rc = PT_ERR_HOST_OOM;
        snprintf(e, sizeof e, "out of host memory for the REKLS scratch of '%s'", p->name);
        if (ws) {
            pt_rekls_tensors x = {q->m, q->n, g, gdt, param, out, p->dtype, c->h_m + s,
                                  c->h_v + s, c->rk_aux + q->aux, ws};
            rc = pt_rekls_step(&pt_rekls_la_cpu, &h, &x, e, sizeof e);
        }
        free(ws);
        if (rc) {
            PT_LOGE(st->env.lg, "parameter '%s': %s", p->name, e);
            pthread_mutex_lock(&st->acct_mu);
            st->rk_failed = rc;
            pthread_mutex_unlock(&st->acct_mu);
        }
    }
}

int pt_rk_dev_chunk(pt_store *st, cs_chunk *c, float lr, float gs, char *err, size_t errlen) {
    pt_model_v1 *m = st->env.model;
    const pt_gpu_backend *ops = pt_gpu_ops(st->env.gpu);
    void *impl = pt_gpu_impl(st->env.gpu);
    pt_optim_state *o = st->env.opt;
    pt_rekls_hyper h = hyper(st, lr, gs, o->t + 1);
    pt_rekls_dev d = {ops, impl, st->env.s_compute, st->d_rk_status};
    pt_rekls_la la;
    int rc = pt_rekls_la_device(&d, &la, err, errlen);
    if (rc) return rc;
    float bc1, bc2r;
    pt_adamw_bias(o->beta1, o->beta2, o->t + 1, &bc1, &bc2r);
    if (ops->memset_async(impl, st->d_rk_status, 0, sizeof(int), st->env.s_compute))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: zeroing REKLS's eigh status failed: memset failed");
    int any = 0;
    for (int j = 0; j < c->lc->n_params; j++) {
        int i = st->lay.order[c->lc->first_param + j];
        const pt_param_v1 *p = &m->params[i];
        if (st->root[i] != i || !st->root_tr[i]) continue;
        uint64_t off = st->lay.param_offset[i], s = state_index(st, c, off);
        if (s == UINT64_MAX) continue;
        size_t n = (size_t)pt_param_numel(p);
        void *graw = (char *)c->d_grad + off;
        float *param = p->dtype == PT_F32 ? (float *)((char *)c->d_param + off) : c->d_master + s;
        void *out = p->dtype == PT_F32 ? NULL : (char *)c->d_param + off;
        int r = st->rk_of[i];
        if (r >= 0) {
            const rk_param *q = &st->rk[r];
            pt_rekls_tensors x = {q->m, q->n, graw, p->dtype, param, out, p->dtype, c->d_m + s,
                                  c->d_v + s, c->rk_aux + q->aux, st->d_rk_ws};
            if ((rc = pt_rekls_step(&la, &h, &x, err, errlen))) return rc;
            any = 1;
            continue;
        }
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
        a.bc1 = bc1;
        a.bc2_rsqrt = bc2r;
        a.grad_scale = gs;
        a.param = param;
        a.param_out = out;
        a.out_dtype = p->dtype;
        a.grad = (const float *)graw;
        if (p->dtype != PT_F32) {
            if (ops->convert(impl, st->d_gtmp, PT_F32, graw, p->dtype, n, 0, st->env.s_compute))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "optimizer_step: widening '%s''s 16-bit gradient failed: convert "
                               "failed", p->name);
            a.grad = st->d_gtmp;
        }
        if (ops->adamw(impl, &a, st->env.s_compute))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "optimizer_step: device AdamW failed on '%s': adamw failed", p->name);
    }
    if (!any) return PT_OK;
    /* eigh reports through a device int: read it once the stream got there */
    int status = 0;
    if (ops->stream_sync(impl, st->env.s_compute) || pt_gpu_memcpy(st->env.gpu, &status, st->d_rk_status, sizeof status, PT_GPU_D2H))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: reading REKLS's eigh status of chunk %d failed: "
                       "stream_sync or memcpy failed", c->id);
    if (status)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: REKLS eigh did not converge in fp32 nor in fp64 in chunk "
                       "%d (non-finite gradients?)", c->id);
    return PT_OK;
}
