/*
 * rekls_dist.c — REKLS in mode C. A rank holds a byte range of each split
 * chunk, so no rank has a whole 2-D gradient; REKLS needs the whole matrix
 * (two-sided products, eigendecompositions of its Kronecker factors). So each
 * REKLS param of a split chunk gets an owner rank that keeps all of its REKLS
 * state, [L R Q_L Q_R lam_L lam_R | M | V] = 2mn + 2m^2 + 2n^2 + m + n fp32
 * words, and nothing of it lives on the other ranks: the state is split by
 * parameter. Per step, in optimizer_step after the global norm:
 *
 *  1. every rank sends each owner its part of the owner's params' reduced
 *     gradient (the fp32 sums the reduce-scatter left in h_gacc; with l2 decay
 *     also its part of the weights), one pt_coll_alltoallv for all params;
 *  2. each owner runs the single-rank step on the whole matrices, its params
 *     spread over the CPU optimizer's workers: G = gradient x clip scale, then
 *     pt_rekls_core, which leaves the update D in G;
 *  3. each owner sends every rank its part of D (a second alltoallv), and every
 *     rank applies W -= c W + lr D to its own part of the weights.
 *
 * Bits: the reduce-scatter forms each element with the all-reduce's rank-order
 * sum, so the gathered gradient is mode B's (h_gacc after its all-reduce); the
 * owner runs the same calls on the same values as mode B's CPU step (the
 * gradient-in and update loops are element-wise, so applying the update part by
 * part gives the bits of one pass over the whole matrix). Mode C with REKLS is
 * therefore bit-identical to mode B with REKLS (tests/dist.sh), except with
 * several micro-batches, where mode C reduces each micro-batch and adds the
 * sums while mode B adds the micro-batches and reduces once (AdamW in mode C
 * shows that same rounding difference).
 *
 * Owners: decided at layout time from the layout alone, so every rank computes
 * the same ones. The exchange happens between the owners' steps, so every rank
 * waits for the slowest owner: the work is balanced first. Params are taken
 * largest step first (GEMM + eigh FLOPs; ties in layout order), each to the
 * rank with the least work so far among those whose REKLS words stay within
 * ceil(T / W) + w_max (T all REKLS words of split chunks, w_max the largest
 * param's); ties go to the rank holding most of its elements (fewer bytes to
 * move), then the lower rank. The rank with the fewest words never holds more
 * than (T - w) / W before taking a param of w words, so some rank always
 * passes and every rank ends at or below that cap: the bound the planner
 * charges per rank. (Measured: choosing the rank holding most of the elements
 * first left one owner with most of the work, and the other rank waited for it
 * in the second exchange for 58-64 ms of a step whose gathers took 0.5 ms.)
 *
 * Traffic per step and param: the non-owners' parts of its gradient, (1 - f) mn
 * floats with f the owner's share, the same back as the update, each rank
 * receiving only its own; with l2 decay the weights' parts too. The log's
 * "REKLS mode C" line (at teardown) gives the seconds and bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rekls_ew.h"
#include "rekls_store.h"

/* This rank's share of param q in the elements of rank p's part of its region:
 * elements [*a, *a + *len) of the param (len 0: none). */
static void share(const pt_store *st, const rk_param *q, int p, uint64_t *a, uint64_t *len) {
    const cs_chunk *c = &st->ch[q->chunk];
    size_t plo, plen;
    pt_coll_part((size_t)c->sh->r[q->reg].n, st->world, p, &plo, &plen);
    uint64_t n = (uint64_t)q->m * (uint64_t)q->n, e1 = q->e0 + n;
    uint64_t lo = q->e0 > plo ? q->e0 : plo, hi = e1 < plo + plen ? e1 : plo + plen;
    *a = hi > lo ? lo - q->e0 : 0;
    *len = hi > lo ? hi - lo : 0;
}

/* This rank's copy of elements [a, a + len) of param q in an array indexed
 * like the chunk's parts: base + the region's part offset. */
static float *part_at(const pt_store *st, const rk_param *q, float *base, uint64_t a) {
    const cs_shreg *h = &st->ch[q->chunk].sh->r[q->reg];
    return base + (q->e0 + a - h->lo);
}
static float *param_at(const pt_store *st, const rk_param *q, uint64_t a) {
    const cs_chunk *c = &st->ch[q->chunk];
    const cs_shreg *h = &c->sh->r[q->reg];
    return (float *)((char *)c->h_param + h->hp_off) + (q->e0 + a - h->lo);
}
static float *grad_at(const pt_store *st, const rk_param *q, uint64_t a) {
    const cs_chunk *c = &st->ch[q->chunk];
    return part_at(st, q, c->h_gacc + c->sh->r[q->reg].st_sh, a);
}

static uint64_t own_words(uint64_t m, uint64_t n) { return pt_rekls_aux_words(m, n) + 2 * m * n; }

/* One candidate of the owner assignment. */
typedef struct {
    int param, chunk, reg, pos;   /* pos: its place in layout order */
    uint64_t e0, w;        /* first element in its region; state words (aux + 2mn) */
    double flops;          /* one step's GEMM and eigh FLOPs */
} own_cand;

/* Largest step first; ties in layout order (qsort is not stable: the index decides). */
static int by_cost(const void *x, const void *y) {
    const own_cand *a = x, *b = y;
    if (a->flops != b->flops) return a->flops > b->flops ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

int pt_rk_sh_owners(pt_store *st, int plan, char *err, size_t errlen) {
    const pt_model_v1 *m = st->env.model;
    pt_rk_store *rs = pt_rk_store_get(st);
    if (!rs) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    int W = st->world, n = 0;
    free(rs->owner);
    rs->owner = malloc(sizeof(int) * (size_t)(m->n_params ? m->n_params : 1));
    uint64_t *load = calloc((size_t)W, sizeof *load);
    double *work = calloc((size_t)W, sizeof *work);
    own_cand *cand = malloc(sizeof *cand * (size_t)(m->n_params ? m->n_params : 1));
    if (!rs->owner || !load || !work || !cand) {
        free(load);
        free(work);
        free(cand);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    for (int i = 0; i < m->n_params; i++) rs->owner[i] = -1;
    uint64_t total = 0, wmax = 0;
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        c->plan.own_words = 0;
        for (int j = 0; c->sh && c->trainable && j < c->lc->n_params; j++) {
            int i = st->lay.order[c->lc->first_param + j];
            if (!pt_rk_eligible(st, i)) continue;
            uint64_t a = (uint64_t)m->params[i].shape[0], b = (uint64_t)m->params[i].shape[1];
            own_cand *q = &cand[n];
            q->pos = n++;
            q->param = i;
            q->chunk = k;
            q->w = own_words(a, b);
            q->flops = pt_rekls_gemm_flops(a, b) + pt_rekls_eigh_flops(a, b);
            uint64_t off = st->lay.param_offset[i];
            for (int r = 0; r < c->lc->n_regions; r++) {
                const pt_chunk_region *g = &c->lc->regions[r];
                if (off >= g->offset && off < g->offset + g->bytes) {
                    q->reg = r;
                    q->e0 = (off - g->offset) / 4;
                }
            }
            total += q->w;
            if (q->w > wmax) wmax = q->w;
        }
    }
    /* the memory cap of every rank: ceil(T / W) + w_max words */
    uint64_t cap = (total + (uint64_t)W - 1) / (uint64_t)W + wmax;
    qsort(cand, (size_t)n, sizeof *cand, by_cost);
    for (int x = 0; x < n; x++) {
        const own_cand *c = &cand[x];
        rk_param q;   /* the geometry share() needs */
        memset(&q, 0, sizeof q);
        q.chunk = c->chunk;
        q.m = (int)m->params[c->param].shape[0];
        q.n = (int)m->params[c->param].shape[1];
        q.reg = c->reg;
        q.e0 = c->e0;
        int best = -1;
        uint64_t best_got = 0;
        for (int r = 0; r < W; r++) {
            uint64_t a, got;
            share(st, &q, r, &a, &got);
            if (load[r] + c->w > cap) continue;
            if (best < 0 || work[r] < work[best] || (work[r] == work[best] && got > best_got)) {
                best = r;
                best_got = got;
            }
        }
        /* (some rank always passes: the one with the fewest words holds at most
         * (T - w) / W before taking this param) */
        if (best < 0) {
            int rc = pt_fail(err, errlen, PT_ERR_INTERNAL, "REKLS mode C: no rank can own '%s' "
                                                           "within the cap of %llu words",
                             m->params[c->param].name,
                             (unsigned long long)cap);
            free(load);
            free(work);
            free(cand);
            return rc;
        }
        load[best] += c->w;
        work[best] += c->flops;
        rs->owner[c->param] = best;
        if (best == st->rank && plan) st->ch[c->chunk].plan.own_words += c->w;
    }
    free(load);
    free(work);
    free(cand);
    return PT_OK;
}

/* ---- the step ---- */

typedef struct {
    pt_store *st;
    const rk_param *q;
    pt_rekls_hyper h;
    float *G, *W;       /* [mn] the whole gradient (becomes D), the weights (l2 only) */
    int rc;
    char err[256];
} own_job;

static void own_step(void *arg) {
    own_job *j = arg;
    const rk_param *q = j->q;
    pt_store *st = j->st;
    double t0 = pt_now_s();
    size_t mn = (size_t)q->m * (size_t)q->n;
    size_t d = (size_t)(q->m > q->n ? q->m : q->n);
    float *ws = malloc(sizeof(float) * (mn + 2 * d * d));
    if (!ws) {
        j->rc = PT_ERR_HOST_OOM;
        snprintf(j->err, sizeof j->err, "out of host memory for the REKLS scratch");
        return;
    }
    float *aux = pt_rk_of_chunk(&st->ch[q->chunk])->aux + q->aux;
    float *M = aux + q->aux_words, *V = M + mn;
    /* step 1 of pt_rekls_step: G = gradient x clip scale (in place, fp32) */
    pt_rekls_ew_args a;
    memset(&a, 0, sizeof a);
    a.kind = PT_RK_GRAD_IN;
    a.n = mn;
    a.x = j->G;
    a.src = j->G;
    a.src_dtype = PT_F32;
    a.a = j->h.grad_scale;
    pt_rekls_ew_range(&a, 0, mn);
    j->rc = pt_rekls_core(&pt_rekls_la_cpu, &j->h, q->m, q->n, pt_rekls_aux_view(aux, q->m, q->n),
                          M, V, j->G, j->W, ws, ws + mn, ws + mn + d * d, j->err, sizeof j->err);
    free(ws);
    pt_cs_add_optim_time(st, pt_now_s() - t0);
}

/* Both exchanges' geometry: per peer p the byte offset and count of what this
 * rank sends p and receives from p, for payloads of `per` floats per shared
 * element (dir 0: parts toward the owners; dir 1: the owners' parts back). */
typedef struct {
    size_t *soff, *sn, *roff, *rn;   /* [W] each, bytes */
    size_t sbytes, rbytes;
} xplan;

static void plan_x(const pt_store *st, int dir, int per, xplan *x) {
    const pt_rk_store *rs = pt_rk_of_store(st);
    int W = st->world, me = st->rank;
    for (int p = 0; p < W; p++) x->sn[p] = x->rn[p] = 0;
    for (int r = 0; r < rs->n_rk; r++) {
        const rk_param *q = &rs->rk[r];
        if (q->owner < 0) continue;
        uint64_t a, len;
        if (dir == 0) {   /* my part to its owner; each peer's part of mine to me */
            share(st, q, me, &a, &len);
            if (q->owner != me) x->sn[q->owner] += len * 4 * (size_t)per;
            for (int p = 0; q->owner == me && p < W; p++) {
                share(st, q, p, &a, &len);
                if (p != me) x->rn[p] += len * 4 * (size_t)per;
            }
        } else {          /* the reverse */
            share(st, q, me, &a, &len);
            if (q->owner != me) x->rn[q->owner] += len * 4 * (size_t)per;
            for (int p = 0; q->owner == me && p < W; p++) {
                share(st, q, p, &a, &len);
                if (p != me) x->sn[p] += len * 4 * (size_t)per;
            }
        }
    }
    x->sbytes = x->rbytes = 0;
    for (int p = 0; p < W; p++) {
        x->soff[p] = x->sbytes;
        x->sbytes += x->sn[p];
        x->roff[p] = x->rbytes;
        x->rbytes += x->rn[p];
    }
}

/* One pass's state: the owned params' jobs and whole matrices, the exchange
 * geometry and buffers, and the per-peer packing positions. */
typedef struct sh_pass {
    pt_store *st;
    int W, me, per, nj;        /* per: floats per shared element (2: the weights travel too) */
    pt_rekls_hyper h;
    size_t *idx, *pos;
    own_job *jobs;
    float *mats;
    xplan x;
    char *sb, *rb;
} sh_pass;

static void pass_close(sh_pass *P) {
    free(P->sb);
    free(P->rb);
    free(P->pos);
    free(P->mats);
    free(P->jobs);
    free(P->idx);
}

/* The jobs of the params this rank owns, each with its whole matrices. */
static int pass_open(sh_pass *P, pt_store *st, float lr, float gs, char *err, size_t errlen) {
    const pt_rk_store *rs = pt_rk_of_store(st);
    memset(P, 0, sizeof *P);
    P->st = st;
    P->W = st->world;
    P->me = st->rank;
    P->h = pt_rk_hyper(st, lr, gs, st->env.opt->t + 1);
    /* l2 decay reads the weights inside the step: they travel with the gradient */
    P->per = P->h.wd_mode == PT_REKLS_WD_L2 && P->h.weight_decay != 0 ? 2 : 1;
    P->idx = calloc((size_t)P->W * 4 + 1, sizeof *P->idx);
    P->jobs = calloc((size_t)rs->n_rk + 1, sizeof *P->jobs);
    /* the owned params' whole matrices: G (then D), and W with l2 */
    size_t full = 0;
    for (int r = 0; r < rs->n_rk; r++)
        if (rs->rk[r].owner == P->me)
            full += (size_t)rs->rk[r].m * (size_t)rs->rk[r].n * (size_t)P->per;
    P->mats = malloc(sizeof(float) * (full + 1));
    if (!P->idx || !P->jobs || !P->mats) {
        pass_close(P);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "optimizer_step: out of host memory for "
                                                     "mode C's REKLS matrices (%zu floats)",
                       full);
    }
    size_t *idx = P->idx;
    P->x = (xplan){idx, idx + P->W, idx + 2 * P->W, idx + 3 * P->W, 0, 0};
    size_t off = 0;
    for (int r = 0; r < rs->n_rk; r++) {
        const rk_param *q = &rs->rk[r];
        if (q->owner != P->me) continue;
        size_t mn = (size_t)q->m * (size_t)q->n;
        own_job *jb = &P->jobs[P->nj++];
        jb->st = st;
        jb->q = q;
        jb->h = P->h;
        jb->G = P->mats + off;
        jb->W = P->per == 2 ? P->mats + off + mn : NULL;
        off += mn * (size_t)P->per;
    }
    return PT_OK;
}

/* 1. every rank's parts of the owned params' gradients (and weights) to the owners */
static int to_owners(sh_pass *P, char *err, size_t errlen) {
    pt_store *st = P->st;
    pt_rk_store *rs = pt_rk_of_store(st);
    const int W = P->W, me = P->me, per = P->per;
    plan_x(st, 0, per, &P->x);
    P->sb = malloc(P->x.sbytes + 1);
    P->rb = malloc(P->x.rbytes + 1);
    int rc = !P->sb || !P->rb ? pt_fail(err, errlen, PT_ERR_HOST_OOM, "optimizer_step: out of host "
                                                                      "memory for mode C's REKLS exchange (%zu + %zu bytes)",
                                        P->x.sbytes, P->x.rbytes)
                              : PT_OK;
    size_t *pos = P->pos = calloc((size_t)W, sizeof *pos);
    if (!rc && !pos) rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    for (int r = 0; !rc && r < rs->n_rk; r++) {   /* pack, in param order per peer */
        const rk_param *q = &rs->rk[r];
        uint64_t a, len;
        if (q->owner < 0 || q->owner == me) continue;
        share(st, q, me, &a, &len);
        if (!len) continue;
        char *d = P->sb + P->x.soff[q->owner] + pos[q->owner];
        memcpy(d, grad_at(st, q, a), (size_t)len * 4);
        if (per == 2) memcpy(d + len * 4, param_at(st, q, a), (size_t)len * 4);
        pos[q->owner] += (size_t)len * 4 * (size_t)per;
    }
    if (!rc)
        rc = pt_coll_alltoallv(st->env.coll, P->sb, P->x.soff, P->x.sn, P->rb, P->x.roff, P->x.rn,
                               "mode C REKLS: gradients to their owners", err, errlen);
    rs->sh_bytes[0] += (double)P->x.rbytes;
    for (int p = 0; p < W && pos; p++) pos[p] = 0;
    for (int j = 0; !rc && j < P->nj; j++) {   /* unpack, the same order; my own part directly */
        const own_job *jb = &P->jobs[j];
        const rk_param *q = jb->q;
        for (int p = 0; p < W; p++) {
            uint64_t a, len;
            share(st, q, p, &a, &len);
            if (!len) continue;
            if (p == me) {
                memcpy(jb->G + a, grad_at(st, q, a), (size_t)len * 4);
                if (per == 2) memcpy(jb->W + a, param_at(st, q, a), (size_t)len * 4);
                continue;
            }
            const char *s = P->rb + P->x.roff[p] + pos[p];
            memcpy(jb->G + a, s, (size_t)len * 4);
            if (per == 2) memcpy(jb->W + a, s + len * 4, (size_t)len * 4);
            pos[p] += (size_t)len * 4 * (size_t)per;
        }
    }
    return rc;
}

/* 2. the owners' steps, one param per task on the CPU optimizer's workers */
static int owner_steps(sh_pass *P, char *err, size_t errlen) {
    pt_store *st = P->st;
    pt_task_group g = PT_TASK_GROUP_INIT;
    for (int j = 0; j < P->nj; j++)
        if (pt_pool_submit(st->workers, own_step, &P->jobs[j], &g, NULL, 0)) own_step(&P->jobs[j]);
    pt_pool_wait(st->workers, &g);
    for (int j = 0; j < P->nj; j++)
        if (P->jobs[j].rc)
            return pt_fail(err, errlen, P->jobs[j].rc, "optimizer_step: mode C REKLS step of '%s' "
                                                       "on its owner: %s",
                           st->env.model->params[P->jobs[j].q->param].name,
                           P->jobs[j].err);
    return PT_OK;
}

/* 3. each rank's part of the update back, applied to its part of the weights
 * (rc: the status so far; the exchange is skipped after a failure) */
static int from_owners(sh_pass *P, float lr, int rc, char *err, size_t errlen) {
    pt_store *st = P->st;
    pt_rk_store *rs = pt_rk_of_store(st);
    const int W = P->W, me = P->me;
    size_t *pos = P->pos;
    free(P->sb);
    free(P->rb);
    P->sb = P->rb = NULL;
    if (!rc) {
        plan_x(st, 1, 1, &P->x);
        P->sb = malloc(P->x.sbytes + 1);
        P->rb = malloc(P->x.rbytes + 1);
        if (!P->sb || !P->rb)
            rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "optimizer_step: out of host memory for "
                                                       "mode C's REKLS updates (%zu + %zu bytes)",
                         P->x.sbytes, P->x.rbytes);
    }
    for (int p = 0; p < W && pos; p++) pos[p] = 0;
    for (int j = 0; !rc && j < P->nj; j++) {
        const rk_param *q = P->jobs[j].q;
        for (int p = 0; p < W; p++) {
            uint64_t a, len;
            share(st, q, p, &a, &len);
            if (p == me || !len) continue;
            memcpy(P->sb + P->x.soff[p] + pos[p], P->jobs[j].G + a, (size_t)len * 4);
            pos[p] += (size_t)len * 4;
        }
    }
    if (!rc)
        rc = pt_coll_alltoallv(st->env.coll, P->sb, P->x.soff, P->x.sn, P->rb, P->x.roff, P->x.rn,
                               "mode C REKLS: updates from their owners", err, errlen);
    rs->sh_bytes[1] += (double)P->x.rbytes;
    for (int p = 0; p < W && pos; p++) pos[p] = 0;
    float c0 = pt_rekls_decay(&P->h);
    for (int r = 0, j = 0; !rc && r < rs->n_rk; r++) {
        const rk_param *q = &rs->rk[r];
        if (q->owner < 0) continue;
        uint64_t a, len;
        share(st, q, me, &a, &len);
        const float *D = NULL;
        if (q->owner == me) {
            D = P->jobs[j++].G + a;
        } else if (len) {
            D = (const float *)(P->rb + P->x.roff[q->owner] + pos[q->owner]);
            pos[q->owner] += (size_t)len * 4;
            /* negative control: the owner's update never reaches this part */
            if (st->env.skip & PT_ORD_RKSHARD) continue;
        }
        if (!len) continue;
        pt_rekls_ew_args e;   /* step 9 of pt_rekls_step on this rank's part */
        memset(&e, 0, sizeof e);
        e.kind = PT_RK_APPLY;
        e.n = len;
        e.x = param_at(st, q, a);
        e.y = D;
        e.a = lr;
        e.c0 = c0;
        pt_rekls_ew_range(&e, 0, len);
    }
    return rc;
}

int pt_rk_sh_pass(pt_store *st, float lr, float gs, char *err, size_t errlen) {
    pt_rk_store *rs = pt_rk_of_store(st);
    int any = 0;
    for (int r = 0; r < rs->n_rk; r++) any |= rs->rk[r].owner >= 0;
    if (!any) return PT_OK;   /* the same on every rank: one plan */
    sh_pass P;
    int rc = pass_open(&P, st, lr, gs, err, errlen);
    if (rc) return rc;
    double t0 = pt_now_s();
    rc = to_owners(&P, err, errlen);
    double t1 = pt_now_s();
    rs->sh_s[0] += t1 - t0;
    if (!rc) rc = owner_steps(&P, err, errlen);
    double t2 = pt_now_s();
    rs->sh_s[1] += t2 - t1;
    rc = from_owners(&P, lr, rc, err, errlen);
    rs->sh_s[2] += pt_now_s() - t2;
    rs->sh_steps += !rc;
    pass_close(&P);
    return rc;
}

/* ---- AdamW over the other params of a split chunk ---- */

void pt_rk_sh_adam(pt_store *st, cs_chunk *c, const pt_adamw_consts *k, int from_acc) {
    const pt_rk_store *rs = pt_rk_of_store(st);
    const pt_rk_chunk *pc = pt_rk_of_chunk(c);
    for (int r = 0; r < c->lc->n_regions; r++) {
        const cs_shreg *h = &c->sh->r[r];
        if (h->st_sh == UINT64_MAX || !h->own) continue;
        /* this rank's part [lo, lo + own) of the region, less the REKLS params'
         * elements (in layout order, so the cut ranges come sorted); AdamW is
         * element-wise, so stepping the rest in pieces gives the same bits */
        uint64_t e = h->lo, end = h->lo + h->own;
        for (int i = pc->first; i <= pc->first + pc->count && e < end; i++) {
            uint64_t cut0 = end, cut1 = end;
            if (i < pc->first + pc->count) {
                const rk_param *q = &rs->rk[i];
                if (q->reg != r) continue;
                cut0 = q->e0;
                cut1 = q->e0 + (uint64_t)q->m * (uint64_t)q->n;
            }
            uint64_t b = cut0 < end ? cut0 : end;
            if (b > e) {
                pt_cpu_adam_args a;
                memset(&a, 0, sizeof a);
                uint64_t s = h->st_sh + (e - h->lo);
                a.n = (size_t)(b - e);
                a.c = *k;
                a.m = c->h_m + s;
                a.v = c->h_v + s;
                a.g = from_acc ? (const void *)(c->h_gacc + s)
                               : (const void *)((const float *)c->h_gstage + s);
                a.g_dtype = PT_F32;
                a.p = (float *)((char *)c->h_param + h->hp_off) + (e - h->lo);
                pt_cpu_adam_range(&a, 0, a.n);
            }
            if (cut1 > e) e = cut1;
        }
    }
}

/* ---- state images ---- */

float *pt_rk_state(pt_store *st, const rk_param *q) {
    const pt_rk_chunk *pc = pt_rk_of_chunk(&st->ch[q->chunk]);
    if (q->owner < 0) return pc->aux + q->aux;
    if (pc->view) return pc->view + q->aux_view;
    return q->owner == st->rank ? pc->aux + q->aux : NULL;
}

/* The image's moments of q: the chunk's full m / v views (open while an image
 * is written or read), at the param's unsplit state index. */
static float *view_m(pt_store *st, const rk_param *q, int v) {
    cs_chunk *c = &st->ch[q->chunk];
    return (v ? c->h_v : c->h_m) + c->sh->r[q->reg].st_full + q->e0;
}

int pt_rk_sh_views_open(pt_store *st, int gather, char *err, size_t errlen) {
    const pt_rk_store *rs = pt_rk_of_store(st);
    int W = st->world, me = st->rank, rc = PT_OK;
    if (!rs) return rc;
    for (int k = 0; k < st->n_chunks && !rc; k++) {
        cs_chunk *c = &st->ch[k];
        pt_rk_chunk *pc = pt_rk_of_chunk(c);
        if (!c->sh || !pc || !pc->view_words) continue;
        if (!(pc->view = calloc((size_t)pc->view_words, sizeof(float))))
            rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "state: out of host memory for chunk %d's "
                                                       "REKLS view",
                         c->id);
    }
    if (rc || !gather) {
        if (rc) pt_rk_sh_views_close(st, 0);
        return rc;
    }
    /* every owner sends every other rank its params' [aux | M | V] */
    size_t *idx = calloc((size_t)W * 4, sizeof *idx);
    size_t mine = 0, theirs = 0;
    for (int r = 0; r < rs->n_rk; r++) {
        const rk_param *q = &rs->rk[r];
        if (q->owner < 0) continue;
        size_t b = 4 * (size_t)own_words((uint64_t)q->m, (uint64_t)q->n);
        if (q->owner == me) mine += b;
        else theirs += b;
    }
    char *sb = malloc(mine + 1), *rb = malloc(theirs + 1);
    if (!idx || !sb || !rb) {
        free(idx);
        free(sb);
        free(rb);
        pt_rk_sh_views_close(st, 0);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "state: out of host memory for the REKLS "
                                                     "state of mode C's owners");
    }
    size_t *soff = idx, *sn = idx + W, *roff = idx + 2 * W, *rn = idx + 3 * W;
    for (int p = 0; p < W; p++) {
        soff[p] = 0;   /* the same bytes to everyone */
        sn[p] = p == me ? 0 : mine;
    }
    for (int r = 0; r < rs->n_rk; r++)
        if (rs->rk[r].owner >= 0 && rs->rk[r].owner != me)
            rn[rs->rk[r].owner] += 4 * (size_t)own_words((uint64_t)rs->rk[r].m, (uint64_t)rs->rk[r].n);
    size_t o = 0;
    for (int p = 0; p < W; p++) {
        roff[p] = o;
        o += rn[p];
    }
    size_t sp = 0;
    for (int r = 0; r < rs->n_rk; r++) {
        const rk_param *q = &rs->rk[r];
        if (q->owner != me) continue;
        size_t b = 4 * (size_t)own_words((uint64_t)q->m, (uint64_t)q->n);
        memcpy(sb + sp, pt_rk_of_chunk(&st->ch[q->chunk])->aux + q->aux, b);
        sp += b;
    }
    rc = pt_coll_alltoallv(st->env.coll, sb, soff, sn, rb, roff, rn,
                           "state: REKLS state of mode C's owners", err, errlen);
    size_t *pos = calloc((size_t)W, sizeof *pos);
    if (!rc && !pos) rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    for (int r = 0; !rc && r < rs->n_rk; r++) {
        const rk_param *q = &rs->rk[r];
        if (q->owner < 0) continue;
        size_t mn = (size_t)q->m * (size_t)q->n, ab = 4 * (size_t)q->aux_words;
        const char *s = q->owner == me ? (const char *)(pt_rk_of_chunk(&st->ch[q->chunk])->aux + q->aux)
                                       : rb + roff[q->owner] + pos[q->owner];
        if (q->owner != me) pos[q->owner] += ab + 8 * mn;
        memcpy(pt_rk_of_chunk(&st->ch[q->chunk])->view + q->aux_view, s, ab);
        memcpy(view_m(st, q, 0), s + ab, 4 * mn);
        memcpy(view_m(st, q, 1), s + ab + 4 * mn, 4 * mn);
    }
    free(pos);
    free(idx);
    free(sb);
    free(rb);
    if (rc) pt_rk_sh_views_close(st, 0);
    return rc;
}

void pt_rk_sh_views_close(pt_store *st, int scatter) {
    const pt_rk_store *rs = pt_rk_of_store(st);
    if (!rs) return;
    /* negative control of a resume: the owners keep the state they had */
    if (st->env.skip & PT_ORD_RKLOAD) scatter = 0;
    for (int r = 0; scatter && r < rs->n_rk; r++) {   /* the owners keep theirs */
        const rk_param *q = &rs->rk[r];
        const pt_rk_chunk *pc = pt_rk_of_chunk(&st->ch[q->chunk]);
        if (q->owner != st->rank || !pc->view) continue;
        size_t mn = (size_t)q->m * (size_t)q->n;
        float *own = pc->aux + q->aux;
        memcpy(own, pc->view + q->aux_view, 4 * (size_t)q->aux_words);
        memcpy(own + q->aux_words, view_m(st, q, 0), 4 * mn);
        memcpy(own + q->aux_words + mn, view_m(st, q, 1), 4 * mn);
    }
    for (int k = 0; k < st->n_chunks; k++) {
        pt_rk_chunk *pc = pt_rk_of_chunk(&st->ch[k]);
        if (!pc) continue;
        free(pc->view);
        pc->view = NULL;
    }
}
