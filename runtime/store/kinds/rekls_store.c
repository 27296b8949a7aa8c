/*
 * rekls_store.c — REKLS inside the chunk store: the store side of the table
 * pt_optk_rekls (optim_kind.h); its state in pt_rk_store / pt_rk_chunk
 * (rekls_store.h), reached through the store's and each chunk's opt.
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
 * eigenvalues (pt_rekls_aux_words) in the chunk's aux block, on the device
 * for resident chunks and in host memory for offloaded ones. Resident chunks
 * step through the backend's ops on the compute stream, in one device scratch
 * sized for the largest resident REKLS param; offloaded chunks on the CPU
 * optimizer's worker that steps the chunk, in a scratch of its own. Both run
 * pt_rekls_step with the same arguments: the same bits on the host backend.
 *
 * Tensor parallel ([dist] tp_size = P > 1; groups of P consecutive ranks,
 * env.tp_coll, data parallel across the groups): a param the host declares split (tp_split 1 or 2) holds its shard; q->m x q->n is the FULL
 * shape. It steps with tensor-parallel REKLS (pt_rk_pass, on the thread of
 * optimizer_step, in layout order so every rank makes the same collectives in
 * the same order): the gradient shards and factor row blocks are gathered, REKLS
 * runs on the full matrices on every rank, each keeps its rows of the factors
 * and applies its slice. Its aux block is [M | V | L rows | R rows]: the
 * moments are full m x n (replicated on every rank, computed redundantly), so
 * they cannot live in the shard-sized m / v slots (those stay unused), then the
 * factor rows m/P x m and n/P x n; no bases (recomputed by eigh). Both full sides
 * must divide by P (refused at create_optimizer otherwise). The step reads and
 * writes device memory with the CPU, which is host memory on the host backend,
 * the only backend multi-rank runs on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_hd.h"
#include "rekls_store.h"

/* The split a param steps with (0 with tp_size 1) and its full 2-D shape. */
static int full_shape(const pt_store *st, const pt_param_v1 *p, int64_t *a, int64_t *b) {
    int P = pt_cs_tp_size(st), split = P > 1 ? p->tp_split : 0;
    *a = p->shape[0] * (split == 1 ? P : 1);
    *b = p->shape[1] * (split == 2 ? P : 1);
    return split;
}

/* aux words of a REKLS param: its own layout (rekls.h), or for a split one
 * [M, V: m x n][L rows: m/P x m][R rows: n/P x n] */
static uint64_t aux_words(const pt_store *st, uint64_t a, uint64_t b, int split) {
    uint64_t P = (uint64_t)pt_cs_tp_size(st);
    return split ? 2 * a * b + a / P * a + b / P * b : pt_rekls_aux_words(a, b);
}

int pt_rk_eligible(const pt_store *st, int i) {
    const pt_model_v1 *m = st->env.model;
    const pt_param_v1 *p = &m->params[i];
    if (st->root[i] != i || !p->trainable || p->ndim != 2 || p->block < 0 || p->tie >= 0)
        return 0;
    int64_t a, b;
    full_shape(st, p, &a, &b);
    if (a < 1 || b < 1 || a > PT_REKLS_MAX_DIM || b > PT_REKLS_MAX_DIM)
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

pt_rk_store *pt_rk_store_get(pt_store *st) {
    if (!st->opt) st->opt = calloc(1, sizeof(pt_rk_store));
    return st->opt;
}

void pt_rk_plan_chunk(pt_store *st, cs_chunk *c) {
    c->plan.aux_words = c->plan.ws_words = 0;
    c->plan.gemm_flops = c->plan.eigh_flops = 0;
    c->plan.n_params = 0;
    c->plan.tp_grad_bytes = c->plan.tp_fac_bytes = 0;
    c->plan.mn = c->plan.own_max = 0;
    /* called when REKLS is the kind planned for (a host descriptor asking for
     * REKLS under an INI that says adamw is planned without its factors; the
     * store allocates them anyway) */
    if (!c->trainable) return;
    const pt_model_v1 *m = st->env.model;
    for (int j = 0; j < c->lc->n_params; j++) {
        int i = st->lay.order[c->lc->first_param + j];
        if (!pt_rk_eligible(st, i)) continue;
        int64_t fa, fb;
        int split = full_shape(st, &m->params[i], &fa, &fb);
        uint64_t a = (uint64_t)fa, b = (uint64_t)fb;
        c->plan.aux_words += aux_words(st, a, b, split);
        c->plan.gemm_flops += pt_rekls_gemm_flops(a, b);
        /* tensor parallel: every rank runs two eighs per factor (the previous
         * bases are recomputed) on the full matrices; its scratch is host memory */
        c->plan.eigh_flops += pt_rekls_eigh_flops(a, b) * (split ? 2 : 1);
        c->plan.n_params++;
        if (split) {   /* pt_rekls_tp_step's gathers: the full gradient, L and R */
            c->plan.tp_grad_bytes += 4 * a * b;
            c->plan.tp_fac_bytes += 4 * (a * a + b * b);
        }
        c->plan.mn += a * b;
        if (!split && pt_rekls_aux_words(a, b) + 2 * a * b > c->plan.own_max)
            c->plan.own_max = pt_rekls_aux_words(a, b) + 2 * a * b;
        uint64_t w = split ? 0 : pt_rekls_ws_words(a, b);
        if (w > c->plan.ws_words) c->plan.ws_words = w;
    }
}

/* Mode C: the owners, known at layout time so each split chunk's own_words
 * counts in its pinned bytes. */
int pt_rk_plan_store(pt_store *st, char *err, size_t errlen) {
    return st->shard ? pt_rk_sh_owners(st, 1, err, errlen) : PT_OK;
}

/* Counts for the log and the largest device workspace, over the chunks. */
typedef struct rk_counts {
    int adam, split, sh, own;
    uint64_t ws_max, words;
} rk_counts;

/* Eligible param i of chunk k: its full shape, state slots, owner and place in
 * the chunk's factor block. */
static int add_param(pt_store *st, int k, int i, rk_counts *n, char *err, size_t errlen) {
    pt_model_v1 *m = st->env.model;
    cs_chunk *c = &st->ch[k];
    pt_rk_store *rs = pt_rk_of_store(st);
    pt_rk_chunk *pc = pt_rk_of_chunk(c);
    rk_param *q = &rs->rk[rs->n_rk];
    q->param = i;
    q->chunk = k;
    int64_t fa, fb;
    q->split = full_shape(st, &m->params[i], &fa, &fb);
    q->m = (int)fa;
    q->n = (int)fb;
    if (q->split) {
        int rc = pt_rekls_tp_check(fa, fb, pt_cs_tp_size(st), q->split, err, errlen);
        if (rc) {
            char why[512];
            snprintf(why, sizeof why, "%s", err);
            return pt_fail(err, errlen, rc, "create_optimizer: split parameter '%s': %s",
                           m->params[i].name, why);
        }
    }
    q->aux_words = aux_words(st, (uint64_t)q->m, (uint64_t)q->n, q->split);
    q->off = st->lay.param_offset[i];
    q->s = state_index(st, c, q->off);
    if (q->s == UINT64_MAX)
        return pt_fail(err, errlen, PT_ERR_INTERNAL,
                       "REKLS: trainable parameter '%s' has no optimizer state slot",
                       m->params[i].name);
    q->owner = c->sh && rs->owner ? rs->owner[i] : -1;
    if (c->sh && q->owner < 0)
        return pt_fail(err, errlen, PT_ERR_INTERNAL, "REKLS: parameter '%s' of the "
                                                     "split chunk %d has no owner rank",
                       m->params[i].name, k);
    q->aux = pc->aux_words;
    if (c->sh) {   /* mode C: only its owner keeps it, moments included */
        for (int r = 0; r < c->lc->n_regions; r++) {
            const pt_chunk_region *g = &c->lc->regions[r];
            if (q->off >= g->offset && q->off < g->offset + g->bytes) {
                q->reg = r;
                q->e0 = (q->off - g->offset) / 4;
            }
        }
        q->aux_view = pc->view_words;
        pc->view_words += q->aux_words;
        if (q->owner == st->rank)
            pc->aux_words += q->aux_words + 2 * (uint64_t)q->m * (uint64_t)q->n;
        else
            q->aux = UINT64_MAX;
        n->sh++;
        n->own += q->owner == st->rank;
    } else {
        pc->aux_words += q->aux_words;
    }
    rs->rk_of[i] = rs->n_rk++;
    n->split += q->split != 0;
    uint64_t w = q->split ? 0 : pt_rekls_ws_words((uint64_t)q->m, (uint64_t)q->n);
    if (c->persistent && w > n->ws_max) n->ws_max = w;
    return PT_OK;
}

/* Chunk k's factor block (pc->aux_words words). */
static int chunk_aux(pt_store *st, int k, char *err, size_t errlen) {
    cs_chunk *c = &st->ch[k];
    pt_rk_store *rs = pt_rk_of_store(st);
    pt_rk_chunk *pc = pt_rk_of_chunk(c);
    /* zero factors, identity bases: built on the host, copied in */
    float *img = calloc((size_t)pc->aux_words, sizeof(float));
    if (!img) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    for (int r = pc->first; r < rs->n_rk; r++)   /* a split one starts all zero */
        if (!rs->rk[r].split && rs->rk[r].aux != UINT64_MAX)
            pt_rekls_aux_init_host(img + rs->rk[r].aux, rs->rk[r].m, rs->rk[r].n);
    int rc = PT_OK;
    size_t bytes = sizeof(float) * (size_t)pc->aux_words;
    if (c->persistent) {
        rc = pt_gpu_alloc(st->env.gpu, bytes, PT_TAG_OPTIM, (void **)&pc->aux, err, errlen);
        if (!rc && pt_gpu_memcpy(st->env.gpu, pc->aux, img, bytes, PT_GPU_H2D))
            rc = pt_fail(err, errlen, PT_ERR_BACKEND,
                         "REKLS: copying chunk %d's initial factors to the device failed", k);
        free(img);
    } else {   /* pinned, like the chunk's moments: the host budget counts it */
        rc = pt_gpu_pinned_alloc(st->env.gpu, bytes, (void **)&pc->aux, err, errlen);
        if (!rc) memcpy(pc->aux, img, bytes);
        free(img);
    }
    return rc;
}

/* The device workspace and eigh status of the resident unsplit params. */
static int dev_workspace(pt_store *st, uint64_t ws_max, char *err, size_t errlen) {
    pt_rk_store *rs = pt_rk_of_store(st);
    if (!ws_max) return PT_OK;
    int rc = pt_gpu_alloc(st->env.gpu, sizeof(float) * (size_t)ws_max, PT_TAG_OPTIM,
                          (void **)&rs->d_ws, err, errlen);
    if (!rc) rc = pt_gpu_alloc(st->env.gpu, sizeof(int), PT_TAG_OTHER,
                               (void **)&rs->d_status, err, errlen);
    if (rc) return rc;
    pt_rekls_dev d = {pt_gpu_ops(st->env.gpu), pt_gpu_impl(st->env.gpu), st->env.s_compute,
                      rs->d_status};
    pt_rekls_la la;
    return pt_rekls_la_device(&d, &la, err, errlen);
}

static void log_init(const pt_store *st, const rk_counts *n) {
    const pt_rk_store *rs = pt_rk_of_store(st);
    PT_LOGI(st->env.lg,
            "REKLS on %d 2-D block parameter(s) (%.1f MiB of factors and bases beyond the Adam "
            "moments on this rank; in mode C with the moments of the params it owns); AdamW on the other %d trainable parameter(s): not 2-D, outside blocks "
            "(embeddings, final norm, head), tied, or a side above %d",
            rs->n_rk,
            (double)n->words * 4 / 1048576.0, n->adam, PT_REKLS_MAX_DIM);
    if (n->sh) {
        /* the owner bound (rekls_dist.c) over the same words, for the log */
        uint64_t tot = 0, wmax = 0, mine = 0;
        for (int r = 0; r < rs->n_rk; r++) {
            const rk_param *q = &rs->rk[r];
            if (q->owner < 0) continue;
            uint64_t w = q->aux_words + 2 * (uint64_t)q->m * (uint64_t)q->n;
            tot += w;
            if (w > wmax) wmax = w;
            if (q->owner == st->rank) mine += w;
        }
        PT_LOGI(st->env.lg, "mode C REKLS: %d of them in chunks split across the %d ranks, each "
                            "kept and stepped whole by one owner rank; this rank owns %d (%llu words of "
                            "state; every rank at most ceil(%llu / %d) + %llu = %llu)",
                n->sh, st->world,
                n->own, (unsigned long long)mine, (unsigned long long)tot, st->world,
                (unsigned long long)wmax,
                (unsigned long long)((tot + (uint64_t)st->world - 1) / (uint64_t)st->world + wmax));
    }
    if (n->split)
        PT_LOGI(st->env.lg, "tensor-parallel REKLS on %d split parameter(s) over a group of %d "
                            "ranks (full matrices stepped on every rank, factors kept in row blocks)",
                n->split, pt_cs_tp_size(st));
}

int pt_rk_init(pt_store *st, char *err, size_t errlen) {
    pt_model_v1 *m = st->env.model;
    pt_rk_store *rs = pt_rk_store_get(st);
    if (!rs) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    /* mode C under a layout planned for another kind: the owners now (the
     * same ones: they depend on the layout alone), without planner terms */
    int rc = st->shard && !rs->owner ? pt_rk_sh_owners(st, 0, err, errlen) : PT_OK;
    if (rc) return rc;
    rs->rk_of = malloc(sizeof(int) * (size_t)m->n_params);
    rs->rk = calloc((size_t)m->n_params, sizeof *rs->rk);
    rs->ch = calloc((size_t)st->n_chunks + 1, sizeof *rs->ch);
    if (!rs->rk_of || !rs->rk || !rs->ch)
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    for (int i = 0; i < m->n_params; i++) rs->rk_of[i] = -1;
    for (int k = 0; k < st->n_chunks; k++) st->ch[k].opt = &rs->ch[k];
    rk_counts n = {0};
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        pt_rk_chunk *pc = pt_rk_of_chunk(c);
        pc->first = rs->n_rk;
        for (int j = 0; c->trainable && j < c->lc->n_params; j++) {
            int i = st->lay.order[c->lc->first_param + j];
            if (!pt_rk_eligible(st, i)) {
                n.adam += st->root[i] == i && m->params[i].trainable;
                continue;
            }
            if ((rc = add_param(st, k, i, &n, err, errlen))) return rc;
        }
        pc->count = rs->n_rk - pc->first;
        if (!pc->count || !pc->aux_words) continue;
        n.words += pc->aux_words;
        if ((rc = chunk_aux(st, k, err, errlen))) return rc;
    }
    rc = dev_workspace(st, n.ws_max, err, errlen);
    if (rc) return rc;
    log_init(st, &n);
    return PT_OK;
}

void pt_rk_fini(pt_store *st) {
    pt_rk_store *rs = pt_rk_of_store(st);
    if (!rs) return;
    if (rs->sh_steps)
        PT_LOGI(st->env.lg, "REKLS mode C: %d steps; per step %.2f ms gathering gradients at "
                            "their owners (%.1f KiB received), %.2f ms in the owners' steps, %.2f ms sending "
                            "the updates back and applying them (%.1f KiB received)",
                rs->sh_steps,
                1e3 * rs->sh_s[0] / rs->sh_steps, rs->sh_bytes[0] / 1024.0 / rs->sh_steps,
                1e3 * rs->sh_s[1] / rs->sh_steps, 1e3 * rs->sh_s[2] / rs->sh_steps,
                rs->sh_bytes[1] / 1024.0 / rs->sh_steps);
    for (int k = 0; st->ch && k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        pt_rk_chunk *pc = pt_rk_of_chunk(c);
        c->opt = NULL;
        if (!pc) continue;
        free(pc->view);
        pc->view = NULL;
        if (!pc->aux) continue;
        if (c->persistent) pt_gpu_free(st->env.gpu, pc->aux);
        else pt_gpu_pinned_free(st->env.gpu, pc->aux);
        pc->aux = NULL;
    }
    pt_gpu_free(st->env.gpu, rs->d_ws);
    pt_gpu_free(st->env.gpu, rs->d_status);
    free(rs->rk);
    free(rs->rk_of);
    free(rs->owner);
    free(rs->ch);
    free(rs);
    st->opt = NULL;
}

pt_rekls_hyper pt_rk_hyper(const pt_store *st, float lr, float gs, int64_t step) {
    const pt_optim_state *o = st->env.opt;
    const pt_config *c = st->env.cfg;
    pt_rekls_hyper h;
    h.lr = lr;
    h.beta1 = o->beta1;
    h.beta2 = o->beta2;
    h.eps = o->rekls_eps;
    h.weight_decay = o->weight_decay;
    h.shampoo_beta = c->rekls_shampoo_beta;
    h.seed_shampoo = c->rekls_seed_shampoo;
    h.k = step;
    h.grad_scale = gs;
    h.wd_mode = c->rekls_wd_method;   /* the INI's 0..3 are pt_rekls_wd's values */
    return h;
}

/* The chunk's params in layout order: REKLS ones by pt_rekls_step, the others
 * by AdamW over their own elements. Runs on a worker. */
static void cpu_chunk(pt_store *st, cs_chunk *c, const pt_adamw_consts *k, int from_acc, float lr,
                      float gs, int64_t step) {
    pt_model_v1 *m = st->env.model;
    pt_rk_store *rs = pt_rk_of_store(st);
    const pt_rk_chunk *pc = pt_rk_of_chunk(c);
    pt_rekls_hyper h = pt_rk_hyper(st, lr, gs, step);
    for (int j = 0; j < c->lc->n_params; j++) {
        int i = st->lay.order[c->lc->first_param + j];
        const pt_param_v1 *p = &m->params[i];
        if (st->root[i] != i || !st->root_tr[i]) continue;
        uint64_t off = st->lay.param_offset[i], s = state_index(st, c, off);
        if (s == UINT64_MAX) continue;
        size_t n = (size_t)pt_store_param_numel(p);
        const void *g = from_acc ? (const void *)(c->h_gacc + s) : (char *)c->h_gstage + off;
        int gdt = from_acc ? PT_F32 : p->dtype;
        float *param = p->dtype == PT_F32 ? (float *)((char *)c->h_param + off) : c->h_master + s;
        void *out = p->dtype == PT_F32 ? NULL : (char *)c->h_param + off;
        int r = rs->rk_of[i];
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
        const rk_param *q = &rs->rk[r];
        if (q->split) continue;   /* pt_rk_pass steps it */
        float *ws = malloc(sizeof(float) * (size_t)pt_rekls_ws_words((uint64_t)q->m, (uint64_t)q->n));
        char e[256];
        int rc = PT_ERR_HOST_OOM;
        snprintf(e, sizeof e, "out of host memory for the REKLS scratch of '%s'", p->name);
        if (ws) {
            pt_rekls_tensors x = {q->m, q->n, g, gdt, param, out, p->dtype, c->h_m + s,
                                  c->h_v + s, pc->aux + q->aux, ws};
            rc = pt_rekls_step(&pt_rekls_la_cpu, &h, &x, e, sizeof e);
        }
        free(ws);
        if (rc) {
            PT_LOGE(st->env.lg, "parameter '%s': %s", p->name, e);
            pthread_mutex_lock(&st->acct_mu);
            rs->failed = rc;
            pthread_mutex_unlock(&st->acct_mu);
        }
    }
}

static int dev_chunk(pt_store *st, cs_chunk *c, float lr, float gs, char *err, size_t errlen) {
    pt_model_v1 *m = st->env.model;
    const pt_rk_store *rs = pt_rk_of_store(st);
    const pt_rk_chunk *pc = pt_rk_of_chunk(c);
    const pt_gpu_backend *ops = pt_gpu_ops(st->env.gpu);
    void *impl = pt_gpu_impl(st->env.gpu);
    pt_optim_state *o = st->env.opt;
    pt_rekls_hyper h = pt_rk_hyper(st, lr, gs, o->t + 1);
    pt_rekls_dev d = {ops, impl, st->env.s_compute, rs->d_status};
    pt_rekls_la la;
    int rc = pt_rekls_la_device(&d, &la, err, errlen);
    if (rc) return rc;
    int any = 0;
    for (int j = 0; j < c->lc->n_params; j++) {
        int i = st->lay.order[c->lc->first_param + j];
        const pt_param_v1 *p = &m->params[i];
        if (st->root[i] != i || !st->root_tr[i]) continue;
        uint64_t off = st->lay.param_offset[i], s = state_index(st, c, off);
        if (s == UINT64_MAX) continue;
        size_t n = (size_t)pt_store_param_numel(p);
        void *graw = (char *)c->d_grad + off;
        float *param = p->dtype == PT_F32 ? (float *)((char *)c->d_param + off) : c->d_master + s;
        void *out = p->dtype == PT_F32 ? NULL : (char *)c->d_param + off;
        int r = rs->rk_of[i];
        if (r >= 0) {
            const rk_param *q = &rs->rk[r];
            if (q->split) continue;   /* pt_rk_pass stepped it */
            /* The workspace and the eigh status exist only when some resident
             * REKLS param is stepped whole here (pt_rk_init sizes them over the
             * unsplit ones): a chunk whose REKLS params are all split has
             * neither, so the status is cleared before the first whole step. */
            if (!any && ops->memset_async(impl, rs->d_status, 0, sizeof(int), st->env.s_compute))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "optimizer_step: zeroing REKLS's eigh status failed: memset failed");
            pt_rekls_tensors x = {q->m, q->n, graw, p->dtype, param, out, p->dtype, c->d_m + s,
                                  c->d_v + s, pc->aux + q->aux, rs->d_ws};
            if ((rc = pt_rekls_step(&la, &h, &x, err, errlen))) return rc;
            any = 1;
            continue;
        }
        pt_adamw_args a = pt_store_adamw_args(st, c, s, n, lr, gs);
        a.param = param;
        a.param_out = out;
        a.out_dtype = p->dtype;
        a.grad = (const float *)graw;
        if (p->dtype != PT_F32) {
            if (ops->convert(impl, st->d_gtmp, PT_F32, graw, p->dtype, n, 0, st->env.s_compute))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "optimizer_step: widening '%s''s 16-bit gradient failed: convert "
                               "failed",
                               p->name);
            a.grad = st->d_gtmp;
        }
        if (ops->adamw(impl, &a, st->env.s_compute))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "optimizer_step: device AdamW failed on '%s': adamw failed", p->name);
    }
    if (!any) return PT_OK;
    /* eigh reports through a device int: read it once the stream got there */
    int status = 0;
    if (ops->stream_sync(impl, st->env.s_compute) || pt_gpu_memcpy(st->env.gpu, &status, rs->d_status, sizeof status, PT_GPU_D2H))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: reading REKLS's eigh status of chunk %d failed: "
                       "stream_sync or memcpy failed",
                       c->id);
    if (status)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "optimizer_step: REKLS eigh did not converge in fp32 nor in fp64 in chunk "
                       "%d (non-finite gradients?)",
                       c->id);
    return PT_OK;
}

static int tp_pass(pt_store *st, float lr, float gs, char *err, size_t errlen) {
    pt_model_v1 *m = st->env.model;
    const pt_rk_store *rs = pt_rk_of_store(st);
    pt_rekls_hyper h = pt_rk_hyper(st, lr, gs, st->env.opt->t + 1);
    pt_rekls_tp tp = {pt_cs_tp_size(st), pt_coll_rank(st->env.tp_coll), 0,
                      pt_rekls_tp_gather_coll, st->env.tp_coll};
    for (int r = 0; r < rs->n_rk; r++) {
        const rk_param *q = &rs->rk[r];
        if (!q->split) continue;
        cs_chunk *c = &st->ch[q->chunk];
        const pt_param_v1 *p = &m->params[q->param];
        /* the step's gradient: resident chunks hold it in place (fp32 or 16-bit),
         * offloaded ones in their fp32 accumulator (always kept with several ranks) */
        const void *g = c->persistent ? (const void *)((char *)c->d_grad + q->off)
                                      : (const void *)(c->h_gacc + q->s);
        int gdt = c->persistent ? p->dtype : PT_F32;
        char *base = c->persistent ? c->d_param : c->h_param;
        float *master = c->persistent ? c->d_master : c->h_master;
        float *param = p->dtype == PT_F32 ? (float *)(base + q->off) : master + q->s;
        void *out = p->dtype == PT_F32 ? NULL : base + q->off;
        size_t mn = (size_t)q->m * (size_t)q->n;
        float *M = pt_rk_of_chunk(c)->aux + q->aux, *V = M + mn, *L = V + mn;
        float *R = L + (size_t)(q->m / tp.P) * (size_t)q->m;
        float *ws = malloc(sizeof(float) * (size_t)pt_rekls_tp_ws_words((uint64_t)q->m,
                                                                        (uint64_t)q->n));
        if (!ws)
            return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                           "out of host memory for the tensor-parallel REKLS scratch of '%s'",
                           p->name);
        tp.split = q->split;
        char e[512];
        pt_rekls_tp_tensors x = {q->m, q->n, g, gdt, param, out, p->dtype, M, V, L, R, ws};
        int rc = pt_rekls_tp_step(&pt_rekls_la_cpu, &h, &tp, &x, e, sizeof e);
        free(ws);
        if (rc) return pt_fail(err, errlen, rc, "optimizer_step: '%s': %s", p->name, e);
    }
    return PT_OK;
}

/* ---- the rest of the table ---- */

int pt_rk_whole_task(const cs_chunk *c) {
    const pt_rk_chunk *pc = pt_rk_of_chunk(c);
    return pc && pc->count;
}

void pt_rk_cpu_step(pt_store *st, cs_chunk *c, const pt_optim_cpu *a) {
    if (!pt_rk_whole_task(c)) {   /* none of its params is REKLS's */
        pt_optk_adamw.cpu_step(st, c, a);
        return;
    }
    /* mode C: AdamW over this rank's parts (REKLS params: pt_rk_sh_pass) */
    if (c->sh) pt_rk_sh_adam(st, c, a->k, a->from_acc);
    else cpu_chunk(st, c, a->k, a->from_acc, a->lr, a->gs, a->step);
}

int pt_rk_dev_step(pt_store *st, cs_chunk *c, float lr, float gs, char *err, size_t errlen) {
    if (!pt_rk_whole_task(c)) return pt_optk_adamw.dev_step(st, c, lr, gs, err, errlen);
    return dev_chunk(st, c, lr, gs, err, errlen);   /* param by param */
}

int pt_rk_pass(pt_store *st, float lr, float gs, char *err, size_t errlen) {
    const pt_rk_store *rs = pt_rk_of_store(st);
    int rc = PT_OK;
    if (!rs) return rc;
    if (pt_cs_tp_size(st) > 1 && (rc = tp_pass(st, lr, gs, err, errlen))) return rc;
    /* mode C: split chunks' REKLS params, at their owners */
    if (st->shard && rs->n_rk && (rc = pt_rk_sh_pass(st, lr, gs, err, errlen))) return rc;
    return rc;
}

int pt_rk_failed(pt_store *st) {
    pt_rk_store *rs = pt_rk_of_store(st);
    int rc = rs ? rs->failed : PT_OK;
    if (rc) rs->failed = 0;
    return rc;
}

float *pt_rk_param_state(pt_store *st, int i, uint64_t *words) {
    const pt_rk_store *rs = pt_rk_of_store(st);
    *words = 0;
    if (!rs || !rs->rk_of || rs->rk_of[i] < 0) return NULL;
    const rk_param *q = &rs->rk[rs->rk_of[i]];
    *words = q->aux_words;
    return pt_rk_state(st, q);
}
