/*
 * gpt.c — GPT-2 parameter table, init, arena layout, block and head forward/backward.
 */
#include "sh_gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sh_ops.h"
#include "sh_rng.h"

/* Largest dims we accept: keeps every size_t product far from overflow and int
 * indexing (N*C, N*4C, B*NH*T*T) inside int range where the kernels use int. */
#define MAX_DIM (1 << 20)

int sh_model_dims_check(sh_dims *d, char *err, size_t errlen) {
    if (d->Vp == 0) d->Vp = (d->V + 127) / 128 * 128;
    const char *bad = NULL;
    int val = 0;
    if (d->V < 1 || d->V > 65536) bad = "vocab (1..65536)", val = d->V;
    else if (d->Vp < d->V || d->Vp > MAX_DIM) bad = "padded vocab (>= vocab)", val = d->Vp;
    else if (d->maxT < 1 || d->maxT > MAX_DIM) bad = "max_seq (>= 1)", val = d->maxT;
    else if (d->L < 1 || d->L > 4096) bad = "layers (1..4096)", val = d->L;
    else if (d->NH < 1 || d->NH > 4096) bad = "heads (1..4096)", val = d->NH;
    else if (d->C < 1 || d->C > 65536) bad = "channels (1..65536)", val = d->C;
    if (!bad && d->C % d->NH != 0) {
        snprintf(err, errlen, "model dimension channels = %d is not a multiple of heads = %d",
                 d->C, d->NH);
        return -1;
    }
    if (bad) {
        snprintf(err, errlen, "model dimension %s has invalid value %d", bad, val);
        return -1;
    }
    return 0;
}

size_t sh_model_param_numel(const pt_param_v1 *p) {
    size_t n = 1;
    for (int i = 0; i < p->ndim; i++) n *= (size_t)p->shape[i];
    return n;
}

static void set_param(sh_model *m, int i, const char *name, int ndim, int64_t s0, int64_t s1,
                      int block) {
    pt_param_v1 *p = &m->params[i];
    snprintf(m->names[i], sizeof m->names[i], "%s", name);
    p->name = m->names[i];
    p->dtype = PT_F32;
    p->ndim = ndim;
    p->shape[0] = s0;
    p->shape[1] = ndim > 1 ? s1 : 0;
    p->block = block;
    p->trainable = 1;
    p->tie = -1;
}

int sh_model_create(sh_model *m, const sh_dims *din, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    sh_dims d = *din;
    if (sh_model_dims_check(&d, err, errlen)) return -1;
    m->d = d;
    int L = d.L, C = d.C;
    m->n_params = SH_N_PARAMS(L);
    m->params = calloc((size_t)m->n_params, sizeof *m->params);
    m->names = calloc((size_t)m->n_params, sizeof *m->names);
    m->off = calloc((size_t)m->n_params, sizeof *m->off);
    if (!m->params || !m->names || !m->off) goto oom;
    set_param(m, SH_P_WTE, "wte", 2, d.Vp, C, -1);
    set_param(m, SH_P_WPE, "wpe", 2, d.maxT, C, -1);
    static const char *ln[SH_NLP] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                     "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"};
    /* (rows, cols) of each per-layer tensor; cols 0 = 1-D */
    int64_t rows[SH_NLP] = {C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C};
    int64_t cols[SH_NLP] = {0, 0, C, 0, C, 0, 0, 0, C, 0, 4 * C, 0};
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < SH_NLP; k++) {
            char nm[24];
            snprintf(nm, sizeof nm, "h%d.%s", l, ln[k]);
            set_param(m, SH_P_LAYER(l, k), nm, cols[k] ? 2 : 1, rows[k], cols[k], l);
        }
    }
    set_param(m, SH_P_LNFW(L), "lnfw", 1, C, 0, -1);
    set_param(m, SH_P_LNFB(L), "lnfb", 1, C, 0, -1);
    set_param(m, SH_P_HEAD(L), "lm_head", 2, d.Vp, C, -1);
    m->params[SH_P_HEAD(L)].tie = SH_P_WTE;
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].tie >= 0) {
            m->off[i] = m->off[m->params[i].tie];
            continue;
        }
        m->off[i] = off;
        off += sh_model_param_numel(&m->params[i]);
    }
    m->n_floats = off;
    m->init = calloc(off, sizeof(float));
    if (!m->init) goto oom;
    for (int i = 0; i < m->n_params; i++)
        m->params[i].init = m->params[i].tie >= 0 ? NULL : m->init + m->off[i];
    return 0;
oom:
    snprintf(err, errlen, "out of host memory building the parameter table (%zu params)",
             (size_t)m->n_params);
    sh_model_destroy(m);
    return -1;
}

void sh_model_destroy(sh_model *m) {
    free(m->params);
    free(m->names);
    free(m->off);
    free(m->init);
    memset(m, 0, sizeof *m);
}

void sh_model_init_random(sh_model *m, uint64_t seed) {
    sh_rng r;
    sh_rng_seed(&r, seed, SH_STREAM_INIT);
    int L = m->d.L;
    float std_res = 0.02f / sqrtf(2.0f * (float)L);
    for (int i = 0; i < m->n_params; i++) {
        pt_param_v1 *p = &m->params[i];
        if (p->tie >= 0) continue;
        float *x = m->init + m->off[i];
        size_t n = sh_model_param_numel(p);
        int k = (i >= 2 && i < SH_P_LNFW(L)) ? (i - 2) % SH_NLP : -1;
        int is_ln_w = k == SH_LN1W || k == SH_LN2W || i == SH_P_LNFW(L);
        if (is_ln_w) {
            for (size_t j = 0; j < n; j++) x[j] = 1.0f;
        } else if (p->ndim == 1) {
            memset(x, 0, n * sizeof(float)); /* biases, LayerNorm shifts */
        } else {
            float std = (k == SH_ATTPROJW || k == SH_FCPROJW) ? std_res : 0.02f;
            size_t live = n;
            if (i == SH_P_WTE) live = (size_t)m->d.V * (size_t)m->d.C; /* padded rows 0 */
            for (size_t j = 0; j < live; j++) x[j] = std * (float)sh_rng_normal(&r);
            for (size_t j = live; j < n; j++) x[j] = 0.0f;
        }
    }
}

static size_t al16(size_t x) { return (x + 15) & ~(size_t)15; }

void sh_model_arena_layout_make(sh_arena_layout *a, const sh_dims *d, int B, int T) {
    sh_model_arena_layout_make_t(a, d, B, T, 0);
}

void sh_model_arena_layout_make_t(sh_arena_layout *a, const sh_dims *d, int B, int T, int tiled) {
    size_t N = (size_t)B * T, C = (size_t)d->C, o = 0;
    /* tiled: the MLP's (N,4C) intermediates are not saved (each tile's backward
     * recomputes them from ln2), so fch and fch_gelu take no room */
    size_t F = tiled ? 0 : N * 4 * C;
    /* each slot starts on a 64-byte boundary (16 floats) */
    a->ln1 = o;
    o = al16(o + N * C);
    a->ln1_mean = o;
    o = al16(o + N);
    a->ln1_rstd = o;
    o = al16(o + N);
    a->qkv = o;
    o = al16(o + N * 3 * C);
    a->atty = o;
    o = al16(o + N * C);
    a->att = o;
    o = al16(o + (size_t)B * d->NH * T * T);
    a->res2 = o;
    o = al16(o + N * C);
    a->ln2 = o;
    o = al16(o + N * C);
    a->ln2_mean = o;
    o = al16(o + N);
    a->ln2_rstd = o;
    o = al16(o + N);
    a->fch = o;
    o = al16(o + F);
    a->fch_gelu = o;
    o = al16(o + F);
    a->total = o;
}

/* The layer table the model runs on: the CPU layers unless the trainer set one. */
static const sh_layer_ops *ops_of(const sh_model *m) { return m->ops ? m->ops : &sh_cpu_ops; }

#define PD(l, k) ((const float *)m->params[SH_P_LAYER(l, k)].data)
#define PG(l, k) ((float *)m->params[SH_P_LAYER(l, k)].grad)

/* OSFT: the plugin decomposed weight k of layer l (its data stays NULL inside the
 * block's window): the layer runs through the plugin's factorised hooks, and its
 * bias (an ordinary parameter, slot k + 1) is added here. A hook failure is kept
 * in *osft_status (the first one) for the trainer to report. */
static int osft_on(const sh_model *m, int l, int k) {
    return m->osft_tbl && !m->params[SH_P_LAYER(l, k)].data;
}
static void osft_fail(const sh_model *m, int32_t st) {
    if (st && m->osft_status && !*m->osft_status) *m->osft_status = st;
}

static void lin_fwd(const sh_model *m, int l, int k, float *out, const float *inp, int N, int IC,
                    int OC) {
    const sh_layer_ops *O = ops_of(m);
    if (!osft_on(m, l, k)) {
        O->matmul_fwd(O->ctx, out, inp, PD(l, k), PD(l, k + 1), N, IC, OC);
        return;
    }
    osft_fail(m, m->osft_tbl->osft_linear_forward(m->osft_ctx, SH_P_LAYER(l, k), inp, out, N));
    const float *b = PD(l, k + 1);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < OC; j++) out[(size_t)r * OC + j] += b[j];
}

static void lin_bwd(const sh_model *m, int l, int k, float *dinp, const float *dout,
                    const float *inp, int N, int IC, int OC, float *wtmp) {
    const sh_layer_ops *O = ops_of(m);
    if (!osft_on(m, l, k)) {
        O->matmul_bwd(O->ctx, dinp, PG(l, k), PG(l, k + 1), dout, inp, PD(l, k), N, IC, OC, wtmp);
        return;
    }
    float *db = PG(l, k + 1);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < OC; j++) db[j] += dout[(size_t)r * OC + j];
    osft_fail(m, m->osft_tbl->osft_linear_backward(m->osft_ctx, SH_P_LAYER(l, k), inp, dout,
                                                   dinp, N));
}

void sh_model_block_fwd_attn(const sh_model *m, int l, float *arena, const float *x, int B, int T,
                             int tiled) {
    const sh_layer_ops *O = ops_of(m);
    sh_arena_layout a;
    sh_model_arena_layout_make_t(&a, &m->d, B, T, tiled);
    int N = B * T, C = m->d.C, NH = m->d.NH;
    float *A = arena;
    O->layernorm_fwd(O->ctx, A + a.ln1, A + a.ln1_mean, A + a.ln1_rstd, x, PD(l, SH_LN1W),
                     PD(l, SH_LN1B), N, C);
    lin_fwd(m, l, SH_QKVW, A + a.qkv, A + a.ln1, N, C, 3 * C);
    O->attention_fwd(O->ctx, A + a.atty, A + a.att, A + a.qkv, B, T, C, NH);
    /* res2 = (atty * attprojw^T + attprojb) + x */
    lin_fwd(m, l, SH_ATTPROJW, A + a.res2, A + a.atty, N, C, C);
    O->add_inplace(O->ctx, A + a.res2, x, (size_t)N * C);
    O->layernorm_fwd(O->ctx, A + a.ln2, A + a.ln2_mean, A + a.ln2_rstd, A + a.res2, PD(l, SH_LN2W),
                     PD(l, SH_LN2B), N, C);
}

void sh_model_mlp_fwd(const sh_model *m, int l, const sh_mlp_rows *r) {
    const sh_layer_ops *O = ops_of(m);
    int n = r->n, C = m->d.C;
    lin_fwd(m, l, SH_FCW, r->fch, r->inp, n, C, 4 * C);
    O->gelu_fwd(O->ctx, r->fch_gelu, r->fch, (size_t)n * 4 * C);
    if (!r->out) return; /* a tile's recompute before its backward */
    /* out = (fch_gelu * fcprojw^T + fcprojb) + res2 */
    lin_fwd(m, l, SH_FCPROJW, r->out, r->fch_gelu, n, 4 * C, C);
    O->add_inplace(O->ctx, r->out, r->res, (size_t)n * C);
}

void sh_model_block_fwd(const sh_model *m, int l, float *arena, const float *x, float *out,
                        int B, int T) {
    sh_arena_layout a;
    sh_model_arena_layout_make(&a, &m->d, B, T);
    sh_model_block_fwd_attn(m, l, arena, x, B, T, 0);
    sh_mlp_rows r = {.n = B * T, .inp = arena + a.ln2, .res = arena + a.res2, .out = out, .fch = arena + a.fch, .fch_gelu = arena + a.fch_gelu};
    sh_model_mlp_fwd(m, l, &r);
}

void sh_model_mlp_bwd(const sh_model *m, int l, const sh_mlp_rows *r) {
    const sh_layer_ops *O = ops_of(m);
    int n = r->n, C = m->d.C;
    /* dbig (n,4C) holds d fch_gelu, then d fch in place; dinp (n,C) = d ln2 */
    lin_bwd(m, l, SH_FCPROJW, r->dbig, r->dout, r->fch_gelu, n, 4 * C, C, r->wtmp);
    O->gelu_bwd(O->ctx, r->dbig, r->fch, r->dbig, (size_t)n * 4 * C);
    lin_bwd(m, l, SH_FCW, r->dinp, r->dbig, r->inp, n, C, 4 * C, r->wtmp);
}

void sh_model_block_bwd_attn(const sh_model *m, int l, const float *arena, const float *x, float *dres,
                             const sh_scratch *s, int B, int T, int tiled) {
    const sh_layer_ops *O = ops_of(m);
    sh_arena_layout a;
    sh_model_arena_layout_make_t(&a, &m->d, B, T, tiled);
    int N = B * T, C = m->d.C, NH = m->d.NH;
    const float *A = arena;
    /* s->dsmall holds d ln2 (the MLP branch's input gradient) */
    O->layernorm_bwd(O->ctx, dres, PG(l, SH_LN2W), PG(l, SH_LN2B), s->dsmall, A + a.res2,
                     PD(l, SH_LN2W), A + a.ln2_mean, A + a.ln2_rstd, N, C);
    /* dres is now dL/d res2; res2 = x + attproj(attn(qkv(ln1(x)))). */
    lin_bwd(m, l, SH_ATTPROJW, s->dsmall, dres, A + a.atty, N, C, C, s->wtmp);
    /* dqkv (N,3C) reuses dbig (N,4C untiled, N,3C tiled), which is free again */
    O->attention_bwd(O->ctx, s->dbig, s->datt, s->nslots, s->dsmall, A + a.qkv, A + a.att, B, T, C, NH);
    lin_bwd(m, l, SH_QKVW, s->dsmall, s->dbig, A + a.ln1, N, C, 3 * C, s->wtmp);
    O->layernorm_bwd(O->ctx, dres, PG(l, SH_LN1W), PG(l, SH_LN1B), s->dsmall, x, PD(l, SH_LN1W),
                     A + a.ln1_mean, A + a.ln1_rstd, N, C);
}

void sh_model_block_bwd(const sh_model *m, int l, const float *arena, const float *x, float *dres,
                        const sh_scratch *s, int B, int T) {
    sh_arena_layout a;
    sh_model_arena_layout_make(&a, &m->d, B, T);
    /* out = res2 + fcproj(gelu(fc(ln2(res2)))): dres flows to res2 unchanged plus the MLP
     * branch */
    sh_mlp_rows r = {.n = B * T, .inp = arena + a.ln2, .fch = (float *)arena + a.fch, .fch_gelu = (float *)arena + a.fch_gelu, .dout = dres, .dinp = s->dsmall, .dbig = s->dbig, .wtmp = s->wtmp};
    sh_model_mlp_bwd(m, l, &r);
    sh_model_block_bwd_attn(m, l, arena, x, dres, s, B, T, 0);
}

void sh_model_head_fwd(const sh_model *m, const sh_head_acts *a, const float *xL,
                       const int32_t *targets, int B, int T, double *loss_acc) {
    const sh_layer_ops *O = ops_of(m);
    int N = B * T, C = m->d.C, L = m->d.L;
    O->layernorm_fwd(O->ctx, a->lnf, a->lnf_mean, a->lnf_rstd, xL,
                     (const float *)m->params[SH_P_LNFW(L)].data,
                     (const float *)m->params[SH_P_LNFB(L)].data, N, C);
    /* logits (N,Vp) = lnf * lm_head^T; lm_head is tied to wte (Vp,C) */
    O->matmul_fwd(O->ctx, a->logits, a->lnf, (const float *)m->params[SH_P_HEAD(L)].data, NULL, N, C,
                  m->d.Vp);
    if (targets)
        O->crossentropy_fwd(O->ctx, a->logits, a->losses, targets, N, m->d.V, m->d.Vp, loss_acc);
}

void sh_model_head_bwd(const sh_model *m, const sh_head_acts *a, const float *xL,
                       const int32_t *targets, float dloss, float *dres, float *dsmall, int B, int T) {
    const sh_layer_ops *O = ops_of(m);
    int N = B * T, C = m->d.C, L = m->d.L;
    O->crossentropy_bwd(O->ctx, a->logits, a->logits, targets, dloss, N, m->d.V, m->d.Vp);
    /* dlnf (N,C) = dlogits * W;  dW(Vp,C) += dlogits^T * lnf  (into the tied grad) */
    const pt_param_v1 *h = &m->params[SH_P_HEAD(L)];
    /* the head is never offloaded (block -1): accumulate in place, no (Vp,C) scratch */
    O->matmul_bwd(O->ctx, dsmall, (float *)h->grad, NULL, a->logits, a->lnf, (const float *)h->data, N,
                  C, m->d.Vp, NULL);
    O->zero(O->ctx, dres, sizeof(float) * (size_t)N * C);
    O->layernorm_bwd(O->ctx, dres, (float *)m->params[SH_P_LNFW(L)].grad,
                     (float *)m->params[SH_P_LNFB(L)].grad, dsmall, xL,
                     (const float *)m->params[SH_P_LNFW(L)].data, a->lnf_mean, a->lnf_rstd, N, C);
}

int sh_model_pick_token(const float *logits, int V, float temperature, sh_rng *rng) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.0f) return best;
    /* p_i ~ exp((z_i - z_max) / temperature), inverse-CDF draw in double */
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)(logits[i] - logits[best]) / temperature);
    double u = sh_rng_uniform(rng) * sum, c = 0.0;
    for (int i = 0; i < V; i++) {
        c += exp((double)(logits[i] - logits[best]) / temperature);
        if (u < c) return i;
    }
    return V - 1;
}
