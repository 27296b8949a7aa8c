/*
 * osft.c — OSFT: decomposition at post_model_load, the expanded parameter list
 * the store lays out, the factorised linear hooks, read_param and launch
 * (osft.h says what and why; the projections are in osft_proj.c).
 *
 * Every hook's product goes through the backend's gemm_f32 / cols_f32 on the compute
 * stream, so it runs after the host's launched work that produced its inputs
 * and before the store's later uses of the memory (gradient copies, slot reuse).
 * Called from inside launched work (the host backend's compute thread) a hook
 * runs its ops at once on that thread, with the factor addresses captured when
 * the work was launched.
 */
#include "osft.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "la_cpu.h"
#include "osft_internal.h"

static const char *const fname[PT_OSFT_NF] = {"osft_U_high", "osft_S_high", "osft_V_high",
                                              "osft_U_low",  "osft_S_low",  "osft_V_low"};

/* Captured at launch for the hooks the launched work calls (thread-local: only
 * the thread running that work sees it). */
typedef struct snap {
    void (*fn)(void *);
    void *arg;
    pt_rt *rt;
    fptr f[];
} snap;
static _Thread_local const snap *tl_snap;

int64_t pt_osft_frozen_rank(int64_t R, float urr) {
    /* the ratio arrives as a float: a product within float rounding of an
     * integer counts as that integer (R = 10, ratio 0.1 freezes 9, not 8) */
    double f = 1.0 - (double)urr;
    int64_t k = (int64_t)floor((double)R * f + (double)R * 1e-7);
    if (k < 0) k = 0;
    if (k > R - 1) k = R - 1;
    return k;
}

static int matches(const char *name, const char *targets) {
    if (!name) return 0;
    const char *p = targets;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *q = e;
        while (q > p && q[-1] == ' ') q--;
        size_t len = (size_t)(q - p);
        if (len) {
            for (const char *s = name; *s; s++)
                if (!strncmp(s, p, len)) return 1;
        }
        p = e;
    }
    return 0;
}

int pt_osft_count(const pt_rt *rt) { return osft_of(rt) ? osft_of(rt)->n : 0; }

int pt_osft_block_of(const pt_rt *rt, int32_t param) {
    const pt_osft *o = osft_of(rt);
    if (!o || param < 0 || param >= o->n_host || o->tmap[param] < 0) return -2;
    return o->t[o->tmap[param]].block;
}

void pt_osft_free(pt_rt *rt) {
    pt_osft *o = osft_of(rt);
    if (!o) return;
    if (rt->model == &o->xm) rt->model = rt->hmodel;
    if (o->scr) pt_gpu_free(rt->dev.gpu, o->scr);
    if (o->split_steps)
        PT_LOGI(&rt->lg, "osft: mode C value projection of split factors: %.3f s over %lld "
                         "steps (%.2f ms a step), of which gathering the factors %.3f s",
                o->split_s, (long long)o->split_steps, 1e3 * o->split_s / (double)o->split_steps,
                o->gather_s);
    if (o->full) pt_gpu_pinned_free(rt->dev.gpu, o->full);
    pt_osft_drop_frozen(rt);
    free(o->fzc);
    pthread_mutex_destroy(&o->mu);
    free(o->xp);
    free(o->names);
    free(o->vals);
    free(o->map);
    free(o->tmap);
    free(o->t);
    free(o);
    pt_rt_ext_set_state(rt, &pt_osft_ext, NULL);
}

void pt_osft_mirror(pt_rt *rt) {
    pt_osft *o = osft_of(rt);
    if (!o || !rt->hmodel) return;
    for (int i = 0; i < o->n_host; i++) {
        pt_param_v1 *h = &rt->hmodel->params[i];
        if (o->map[i] < 0) {
            h->data = NULL;
            h->grad = NULL;
        } else {
            h->data = o->xp[o->map[i]].data;
            h->grad = o->xp[o->map[i]].grad;
        }
    }
}

void pt_osft_bytes(const pt_rt *rt, uint64_t *frozen, uint64_t *trainable, uint64_t *dense) {
    *frozen = *trainable = *dense = 0;
    const pt_osft *o = osft_of(rt);
    for (int i = 0; o && i < o->n; i++) {
        const tgt *t = &o->t[i];
        *frozen += 4u * (uint64_t)(t->N * t->k + t->k + t->k * t->M);
        *trainable += 4u * (uint64_t)(t->N * t->kl + t->kl + t->kl * t->M);
        *dense += 4u * (uint64_t)(t->N * t->M);
    }
}

/* ---- decomposition ---- */

/* Thin SVD of the host's W (N x M) on the device: into u (N x R), s (R), vt (R x M). */
static int svd_one(pt_rt *rt, const float *w, int64_t N, int64_t M, float *u, float *s,
                   float *vt, const char *name, char *err, size_t errlen) {
    int64_t R = N < M ? N : M;
    size_t na = (size_t)(N * M), nu = (size_t)(N * R), nv = (size_t)(R * M);
    size_t bytes = 4 * (na + nu + (size_t)R + nv) + 16;
    char *d = NULL;
    int rc = pt_gpu_alloc(rt->dev.gpu, bytes, PT_TAG_SCRATCH, (void **)&d, err, errlen);
    if (rc) return rc;
    float *da = (float *)d, *du = da + na, *ds = du + nu, *dv = ds + R;
    int32_t *dinfo = (int32_t *)(dv + nv), info = -1;
    pt_svd_args a = {N, M, da, du, ds, dv, dinfo};
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    char e[256];
    if ((rc = pt_gpu_memcpy_sync(rt->dev.gpu, da, w, 4 * na, PT_GPU_H2D, e, sizeof e)))
        pt_fail(err, errlen, rc, "osft: uploading '%s' for its SVD failed: %s", name, e);
    else if (ops->svd_f32(pt_gpu_impl(rt->dev.gpu), &a, NULL))
        rc = pt_fail(err, errlen, PT_ERR_BACKEND, "osft: the SVD of '%s' (%lld x %lld) failed "
                     "on the %s backend: svd_f32 failed", name, (long long)N, (long long)M,
                     pt_gpu_backend_name(rt->dev.gpu));
    else if ((rc = pt_gpu_memcpy_sync(rt->dev.gpu, &info, dinfo, 4, PT_GPU_D2H, e, sizeof e)) ||
             (rc = pt_gpu_memcpy_sync(rt->dev.gpu, u, du, 4 * nu, PT_GPU_D2H, e, sizeof e)) ||
             (rc = pt_gpu_memcpy_sync(rt->dev.gpu, s, ds, 4 * (size_t)R, PT_GPU_D2H, e, sizeof e)) ||
             (rc = pt_gpu_memcpy_sync(rt->dev.gpu, vt, dv, 4 * nv, PT_GPU_D2H, e, sizeof e)))
        pt_fail(err, errlen, rc, "osft: reading the SVD of '%s' back failed: %s", name, e);
    else if (info != 0)
        rc = pt_fail(err, errlen, PT_ERR_BACKEND, "osft: the SVD of '%s' (%lld x %lld) did not "
                     "converge (solver code %d)", name, (long long)N, (long long)M, (int)info);
    pt_gpu_free(rt->dev.gpu, d);
    return rc;
}

/* Refusals: what a target cannot be. */
static int check_target(const pt_model_v1 *h, int i, char *err, size_t errlen) {
    const pt_param_v1 *p = &h->params[i];
    if (p->dtype != PT_F32)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "osft: target '%s' is %s; OSFT factors "
                       "are built for fp32 parameters only (narrow [osft] targets)", p->name,
                       p->dtype == PT_BF16 ? "bf16" : p->dtype == PT_F16 ? "fp16" : "u8 (opaque bytes)");
    if (p->shape[0] > INT32_MAX || p->shape[1] > INT32_MAX)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "osft: target '%s' is %lld x %lld; the "
                       "CPU's GEMM takes dimensions below 2^31", p->name,
                       (long long)p->shape[0], (long long)p->shape[1]);
    if (p->tie >= 0)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "osft: target '%s' shares storage with "
                       "param %d (tie); a tied weight cannot be factorised (narrow [osft] "
                       "targets)", p->name, p->tie);
    for (int j = 0; j < h->n_params; j++)
        if (h->params[j].tie == i)
            return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "osft: target '%s' is tied to by "
                           "'%s'; a tied weight cannot be factorised (narrow [osft] targets)",
                           p->name, h->params[j].name ? h->params[j].name : "(unnamed)");
    return PT_OK;
}

/* OSFT's state for nt targets of a model of n_host params; NULL: out of host memory. */
static pt_osft *state_new(int n_host, int nt) {
    pt_osft *o = calloc(1, sizeof *o);
    int nx = n_host + nt * (PT_OSFT_NF - 1);
    if (o) {
        o->xp = calloc((size_t)nx, sizeof *o->xp);
        o->names = calloc((size_t)nt * PT_OSFT_NF, sizeof *o->names);
        o->map = calloc((size_t)n_host, sizeof *o->map);
        o->tmap = calloc((size_t)n_host, sizeof *o->tmap);
        o->t = calloc((size_t)nt, sizeof *o->t);
    }
    if (!o || !o->xp || !o->names || !o->map || !o->tmap || !o->t) {
        if (o) {
            free(o->xp), free(o->names), free(o->map), free(o->tmap), free(o->t);
            free(o);
        }
        return NULL;
    }
    pthread_mutex_init(&o->mu, NULL);
    o->n_host = n_host;
    return o;
}

/* The targets, their ranks, and the floats of factor storage they need. */
static size_t find_targets(pt_rt *rt, const pt_model_v1 *h) {
    pt_osft *o = osft_of(rt);
    size_t nvals = 0;
    for (int i = 0; i < o->n_host; i++) {
        const pt_param_v1 *p = &h->params[i];
        o->tmap[i] = -1;
        if (p->ndim != 2 || !p->trainable || !matches(p->name, rt->cfg.osft_targets)) continue;
        tgt *t = &o->t[o->n];
        o->tmap[i] = o->n++;
        t->hidx = i;
        t->block = p->block;
        t->N = p->shape[0];
        t->M = p->shape[1];
        t->R = t->N < t->M ? t->N : t->M;
        t->k = pt_osft_frozen_rank(t->R, rt->cfg.osft_urr);
        t->kl = t->R - t->k;
        nvals += (size_t)(t->N * t->R + t->R + t->R * t->M);
    }
    return nvals;
}

/* Where the decomposition writes: the next factor values, the SVD's U scratch,
 * the next index of the expanded list, and the seconds spent in SVDs. */
typedef struct build {
    float *v, *scr_u;
    int x;
    double t_all;
} build;

/* Target p (host index i): its SVD, and its six factors appended to the expanded list. */
static int decompose_one(pt_rt *rt, const pt_param_v1 *p, int i, build *b, char *err,
                         size_t errlen) {
    pt_osft *o = osft_of(rt);
    tgt *t = &o->t[o->tmap[i]];
    int64_t N = t->N, M = t->M, R = t->R, k = t->k, kl = t->kl;
    float *uh = b->v, *ul = uh + N * k, *s = ul + N * kl, *vt = s + R;
    b->v = vt + R * M;
    double t0 = pt_now_s();
    int rc = svd_one(rt, (const float *)p->init, N, M, b->scr_u, s, vt, p->name, err, errlen);
    double dt = pt_now_s() - t0;
    b->t_all += dt;
    if (rc) return rc;
    /* U's columns split at k: U_high = U[:, :k], U_low = U[:, k:] (row-major) */
    for (int64_t r = 0; r < N; r++) {
        memcpy(uh + r * k, b->scr_u + r * R, (size_t)k * 4);
        memcpy(ul + r * kl, b->scr_u + r * R + k, (size_t)kl * 4);
    }
    /* S and Vt split at row k in place: S_high = s[:k], V_high = vt[:k] */
    const float *src[PT_OSFT_NF] = {uh, s, vt, ul, s + k, vt + k * M};
    const int64_t shp[PT_OSFT_NF][2] = {{N, k}, {k, 0}, {k, M}, {N, kl}, {kl, 0}, {kl, M}};
    for (int f = 0; f < PT_OSFT_NF; f++) {
        t->x[f] = -1;
        if (f < PT_OSFT_UL && k == 0) continue;   /* nothing frozen: no high factors */
        char *nm = o->names[o->tmap[i] * PT_OSFT_NF + f];
        snprintf(nm, sizeof o->names[0], "%s.%s", p->name, fname[f]);
        pt_param_v1 *q = &o->xp[b->x];
        *q = (pt_param_v1){.name = nm, .dtype = PT_F32, .ndim = shp[f][1] ? 2 : 1,
                           .shape = {shp[f][0], shp[f][1]}, .block = p->block,
                           .trainable = f >= PT_OSFT_UL, .tie = -1, .init = src[f]};
        t->x[f] = b->x++;
    }
    PT_LOGI(&rt->lg, "osft: '%s' %lld x %lld, rank %lld: %lld frozen, %lld trainable "
                     "(SVD %.3f s)", p->name, (long long)N, (long long)M, (long long)R,
            (long long)k, (long long)kl, dt);
    return PT_OK;
}

/* Decompose the targets, then lay the expanded list out in the host's order. */
static int decompose(pt_rt *rt, const pt_model_v1 *h, size_t nvals, build *b, char *err,
                     size_t errlen) {
    pt_osft *o = osft_of(rt);
    o->vals = malloc(nvals * sizeof(float));
    float *scr_u = NULL, *scr_v = NULL;
    int64_t mu = 0, mv = 0;
    for (int i = 0; i < o->n; i++) {
        if (o->t[i].N * o->t[i].R > mu) mu = o->t[i].N * o->t[i].R;
        if (o->t[i].R * o->t[i].M > mv) mv = o->t[i].R * o->t[i].M;
    }
    scr_u = malloc((size_t)mu * sizeof(float));
    scr_v = malloc((size_t)mv * sizeof(float));
    if (!o->vals || !scr_u || !scr_v) {
        free(scr_u), free(scr_v);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "osft: out of host memory for the factors "
                       "(%zu floats)", nvals);
    }
    b->v = o->vals;
    b->scr_u = scr_u;
    int rc = PT_OK;
    for (int i = 0; i < o->n_host && !rc; i++) {
        const pt_param_v1 *p = &h->params[i];
        if (o->tmap[i] < 0) {
            o->map[i] = b->x;
            o->xp[b->x] = *p;
            o->xp[b->x].data = o->xp[b->x].grad = NULL;
            b->x++;
            continue;
        }
        o->map[i] = -1;
        rc = decompose_one(rt, p, i, b, err, errlen);
    }
    free(scr_u);
    free(scr_v);
    return rc;
}

/* The hooks' scratch for batch x seq rows (backward: rows x (2 kl + k)), and
 * the projections' k x kl coefficients, in floats. */
static uint64_t scratch_floats(const pt_osft *o, const pt_model_v1 *h) {
    int64_t rows = h->batch * h->seq > 0 ? h->batch * h->seq : 1;
    uint64_t need = 0;
    for (int i = 0; i < o->n; i++) {
        const tgt *t = &o->t[i];
        uint64_t a = (uint64_t)(rows * (2 * t->kl + t->k)), b = (uint64_t)(t->k * t->kl);
        if (a > need) need = a;
        if (b > need) need = b;
    }
    return need;
}

int pt_osft_setup(pt_rt *rt, pt_model_v1 *h, char *err, size_t errlen) {
    pt_osft_free(rt);
    rt->hmodel = h;
    rt->model = h;
    if (!rt->cfg.osft_enabled) return PT_OK;
    int n_host = h->n_params, nt = 0;
    for (int i = 0; i < n_host; i++) {
        const pt_param_v1 *p = &h->params[i];
        if (p->ndim != 2 || !p->trainable || !matches(p->name, rt->cfg.osft_targets)) continue;
        int rc = check_target(h, i, err, errlen);
        if (rc) return rc;
        nt++;
    }
    if (!nt) {
        /* training dense when OSFT was asked for is a different run, not a detail:
         * refused, with names the targets could have matched */
        char ex[256] = "";
        for (int i = 0, k = 0; i < n_host && k < 4; i++) {
            const pt_param_v1 *p = &h->params[i];
            if (p->ndim != 2 || !p->trainable) continue;
            size_t u = strlen(ex);
            snprintf(ex + u, sizeof ex - u, "%s'%.40s'", k++ ? ", " : "", p->name ? p->name : "");
        }
        return pt_fail(err, errlen, PT_ERR_CONFIG, "[osft] enabled, but no trainable 2-D "
                       "parameter's name contains any of targets = '%s' (this model's 2-D "
                       "weights are named like %s): set targets to substrings of those names, "
                       "or enabled = false to train dense", rt->cfg.osft_targets,
                       ex[0] ? ex : "(none: no trainable 2-D parameter)");
    }
    pt_osft *o = state_new(n_host, nt);
    if (!o)
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "osft: out of host memory for %d targets",
                       nt);
    pt_rt_ext_set_state(rt, &pt_osft_ext, o);
    build b = {0};
    int rc = decompose(rt, h, find_targets(rt, h), &b, err, errlen);
    if (rc) {
        pt_osft_free(rt);
        return rc;
    }
    /* ties among the ordinary params point at their new indices */
    for (int i = 0; i < n_host; i++)
        if (o->map[i] >= 0 && h->params[i].tie >= 0) o->xp[o->map[i]].tie = o->map[h->params[i].tie];
    o->xm = *h;
    o->xm.n_params = b.x;
    o->xm.params = o->xp;
    uint64_t need = scratch_floats(o, h);
    if ((rc = pt_gpu_alloc(rt->dev.gpu, (size_t)need * 4, PT_TAG_SCRATCH, (void **)&o->scr, err,
                           errlen))) {
        pt_osft_free(rt);
        return rc;
    }
    o->scr_floats = need;
    rt->model = &o->xm;
    uint64_t fz, tr, dn;
    pt_osft_bytes(rt, &fz, &tr, &dn);
    PT_LOGI(&rt->lg, "osft: %d target(s) (unfreeze_rank_ratio %g, targets '%s'), SVD %.3f s in "
                     "all; factors %.2f MiB frozen + %.2f MiB trainable in place of %.2f MiB "
                     "dense", o->n, (double)rt->cfg.osft_urr, rt->cfg.osft_targets, b.t_all,
            fz / 1048576.0, tr / 1048576.0, dn / 1048576.0);
    pt_osft_mirror(rt);
    return PT_OK;
}

/* ---- the ops ---- */

void pt_osft_mm(lin *L, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                int64_t ldc) {
    if (L->rc) return;
    if (L->cpu) {
        /* as the host backend runs it: BLAS may read C before scaling it by 0,
         * so a NaN there would survive; the sizes fit an int (checked at setup) */
        if (beta == 0.0f)
            for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, (size_t)n * 4);
        pt_la_sgemm(ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c,
                    (int)ldc);
        return;
    }
    pt_gemm_args g = {ta, tb, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc};
    if (L->ops->gemm_f32(L->impl, &g, L->s)) L->rc = PT_ERR_BACKEND;
}
static void scale_cols(lin *L, float *x, const float *s, int64_t rows, int64_t cols) {
    if (L->rc) return;
    pt_cols_args a = {PT_COLS_SCALE, rows, cols, cols, x, NULL, s, x, NULL};
    if (L->ops->cols_f32(L->impl, &a, L->s)) L->rc = PT_ERR_BACKEND;
}
static void dot_cols(lin *L, const float *x, const float *y, float *acc, int64_t rows,
                     int64_t cols) {
    if (L->rc) return;
    pt_cols_args a = {PT_COLS_DOT, rows, cols, cols, x, y, NULL, NULL, acc};
    if (L->ops->cols_f32(L->impl, &a, L->s)) L->rc = PT_ERR_BACKEND;
}

void pt_osft_live_ptrs(const pt_osft *o, const tgt *t, fptr *f) {
    for (int j = 0; j < PT_OSFT_NF; j++) {
        f->d[j] = t->x[j] >= 0 ? (const float *)o->xp[t->x[j]].data : NULL;
        f->g[j] = t->x[j] >= 0 ? (float *)o->xp[t->x[j]].grad : NULL;
    }
}

void pt_osft_lin_open(pt_rt *rt, lin *L) {
    L->ops = pt_gpu_ops(rt->dev.gpu);
    L->impl = pt_gpu_impl(rt->dev.gpu);
    L->s = tl_snap ? NULL : rt->dev.s_compute;
    L->cpu = 0;
    L->rc = PT_OK;
}

int pt_osft_scratch_get(pt_rt *rt, uint64_t n, float **p, char *err, size_t errlen) {
    if (n <= osft_of(rt)->scr_floats) {
        *p = osft_of(rt)->scr;
        return PT_OK;
    }
    return pt_gpu_alloc(rt->dev.gpu, (size_t)n * 4, PT_TAG_SCRATCH, (void **)p, err, errlen);
}

void pt_osft_scratch_free(pt_rt *rt, void *p) {
    if (!p || p == osft_of(rt)->scr) return;
    if (tl_snap) {
        pt_gpu_free(rt->dev.gpu, p);
        return;
    }
    char e[128];
    if (pt_gpu_free_on_stream(rt->dev.gpu, p, rt->dev.s_compute, e, sizeof e))
        PT_LOGW(&rt->lg, "osft: freeing scratch: %s", e);
}

/* Ops queued on the compute stream: a host computing on its own thread reads the
 * results when the hook returns, so wait for them there. */
int pt_osft_lin_close(pt_rt *rt, lin *L, const char *what, char *err, size_t errlen) {
    if (!L->rc && !tl_snap && !rt->dev.ordered && L->ops->stream_sync(L->impl, rt->dev.s_compute))
        L->rc = PT_ERR_BACKEND;
    if (L->rc)
        return pt_fail(err, errlen, PT_ERR_BACKEND, "%s: a gemm_f32 / cols_f32 op failed on the "
                       "%s backend", what, pt_gpu_backend_name(rt->dev.gpu));
    return PT_OK;
}

/* Record a failure of a hook called inside launched work (reported later). */
static int async_fail(pt_rt *rt, int rc, const char *msg) {
    if (!tl_snap || !rc) return rc;
    pt_osft *o = osft_of(rt);
    pthread_mutex_lock(&o->mu);
    if (!o->async_rc) {
        o->async_rc = rc;
        snprintf(o->async_err, sizeof o->async_err, "%s", msg);
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

int pt_osft_async_status(pt_rt *rt, char *err, size_t errlen) {
    pt_osft *o = osft_of(rt);
    if (!o) return PT_OK;
    pthread_mutex_lock(&o->mu);
    int rc = o->async_rc;
    if (rc) pt_fail(err, errlen, rc, "an OSFT hook called inside launched work failed: %s",
                    o->async_err);
    o->async_rc = 0;
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* Target of host param `param` and its factor addresses (captured or live). */
static int resolve(pt_rt *rt, int32_t param, const char *hook, int need_grads, const tgt **tt,
                   fptr *f, char *err, size_t errlen) {
    pt_osft *o = osft_of(rt);
    if (!o || param < 0 || param >= o->n_host || o->tmap[param] < 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "%s: param %d is not an OSFT target "
                       "(%d decomposed; see the log's 'osft:' lines)", hook, (int)param,
                       o ? o->n : 0);
    const tgt *t = &o->t[o->tmap[param]];
    if (tl_snap) *f = tl_snap->f[o->tmap[param]];
    else pt_osft_live_ptrs(o, t, f);
    int missing = !f->d[PT_OSFT_UL] || !f->d[PT_OSFT_SL] || !f->d[PT_OSFT_VL] ||
                  (t->k && (!f->d[PT_OSFT_UH] || !f->d[PT_OSFT_SH] || !f->d[PT_OSFT_VH])) ||
                  (need_grads && (!f->g[PT_OSFT_UL] || !f->g[PT_OSFT_SL] || !f->g[PT_OSFT_VL]));
    if (missing)
        return pt_fail(err, errlen, PT_ERR_ORDER, "%s: the factors of '%s' are not on the "
                       "device now: call it inside block %d's %s window", hook,
                       rt->hmodel->params[param].name, t->block,
                       need_grads ? "backward" : "forward");
    *tt = t;
    return PT_OK;
}

int pt_osft_forward(pt_rt *rt, int32_t param, const void *xv, void *yv, int64_t rows, char *err,
                    size_t errlen) {
    const tgt *t;
    fptr f;
    int rc = resolve(rt, param, "osft_linear_forward", 0, &t, &f, err, errlen);
    if (!rc && (!xv || !yv || rows < 1))
        rc = pt_fail(err, errlen, PT_ERR_INVALID_ARG, "osft_linear_forward: x or y is NULL or "
                     "rows (%lld) < 1", (long long)rows);
    if (rc) return async_fail(rt, rc, err);
    const float *x = xv;
    float *y = yv, *a = NULL;
    int64_t N = t->N, M = t->M, k = t->k, kl = t->kl;
    int64_t w = k > kl ? k : kl;
    /* a: rows x max(k, kl), the projection x V^T of one branch at a time */
    if ((rc = pt_osft_scratch_get(rt, (uint64_t)(rows * w), &a, err, errlen)))
        return async_fail(rt, rc, err);
    lin L;
    pt_osft_lin_open(rt, &L);
    /* y = ((x V_high^T) S_high) U_high^T + ((x V_low^T) S_low) U_low^T */
    if (k) {
        pt_osft_mm(&L, 0, 1, rows, k, M, 1.0f, x, M, f.d[PT_OSFT_VH], M, 0.0f, a, k);
        scale_cols(&L, a, f.d[PT_OSFT_SH], rows, k);
        pt_osft_mm(&L, 0, 1, rows, N, k, 1.0f, a, k, f.d[PT_OSFT_UH], k, 0.0f, y, N);
    }
    pt_osft_mm(&L, 0, 1, rows, kl, M, 1.0f, x, M, f.d[PT_OSFT_VL], M, 0.0f, a, kl);
    scale_cols(&L, a, f.d[PT_OSFT_SL], rows, kl);
    pt_osft_mm(&L, 0, 1, rows, N, kl, 1.0f, a, kl, f.d[PT_OSFT_UL], kl, k ? 1.0f : 0.0f, y, N);
    pt_osft_scratch_free(rt, a);
    return async_fail(rt, pt_osft_lin_close(rt, &L, "osft_linear_forward", err, errlen), err);
}

int pt_osft_backward(pt_rt *rt, int32_t param, const void *xv, const void *dyv, void *dxv,
                     int64_t rows, char *err, size_t errlen) {
    const tgt *t;
    fptr f;
    int rc = resolve(rt, param, "osft_linear_backward", 1, &t, &f, err, errlen);
    if (!rc && (!xv || !dyv || rows < 1))
        rc = pt_fail(err, errlen, PT_ERR_INVALID_ARG, "osft_linear_backward: x or dy is NULL "
                     "or rows (%lld) < 1", (long long)rows);
    if (rc) return async_fail(rt, rc, err);
    const float *x = xv, *dy = dyv;
    float *dx = dxv, *scr = NULL;
    int64_t N = t->N, M = t->M, k = t->k, kl = t->kl;
    /* scratch: al, e (rows x kl each), h (rows x k) */
    if ((rc = pt_osft_scratch_get(rt, (uint64_t)(rows * (2 * kl + k)), &scr, err, errlen)))
        return async_fail(rt, rc, err);
    float *al = scr, *e = al + rows * kl, *h = e + rows * kl;
    lin L;
    pt_osft_lin_open(rt, &L);
    /* a_l = x V_low^T; e = dY U_low; dS_low += sum_t a_l * e */
    pt_osft_mm(&L, 0, 1, rows, kl, M, 1.0f, x, M, f.d[PT_OSFT_VL], M, 0.0f, al, kl);
    pt_osft_mm(&L, 0, 0, rows, kl, N, 1.0f, dy, N, f.d[PT_OSFT_UL], kl, 0.0f, e, kl);
    dot_cols(&L, al, e, f.g[PT_OSFT_SL], rows, kl);
    /* dU_low += dY^T (a_l S_low) */
    scale_cols(&L, al, f.d[PT_OSFT_SL], rows, kl);
    pt_osft_mm(&L, 1, 0, N, kl, rows, 1.0f, dy, N, al, kl, 1.0f, f.g[PT_OSFT_UL], kl);
    /* dV_low += (e S_low)^T x */
    scale_cols(&L, e, f.d[PT_OSFT_SL], rows, kl);
    pt_osft_mm(&L, 1, 0, kl, M, rows, 1.0f, e, kl, x, M, 1.0f, f.g[PT_OSFT_VL], M);
    /* dx = (e S_low) V_low + ((dY U_high) S_high) V_high */
    if (dx) {
        pt_osft_mm(&L, 0, 0, rows, M, kl, 1.0f, e, kl, f.d[PT_OSFT_VL], M, 0.0f, dx, M);
        if (k) {
            pt_osft_mm(&L, 0, 0, rows, k, N, 1.0f, dy, N, f.d[PT_OSFT_UH], k, 0.0f, h, k);
            scale_cols(&L, h, f.d[PT_OSFT_SH], rows, k);
            pt_osft_mm(&L, 0, 0, rows, M, k, 1.0f, h, k, f.d[PT_OSFT_VH], M, 1.0f, dx, M);
        }
    }
    pt_osft_scratch_free(rt, scr);
    return async_fail(rt, pt_osft_lin_close(rt, &L, "osft_linear_backward", err, errlen), err);
}

/* ---- host services ---- */

int pt_osft_read_param(pt_rt *rt, int32_t index, void *dst, uint64_t bytes, char *err,
                       size_t errlen) {
    pt_osft *o = osft_of(rt);
    if (index < 0 || index >= o->n_host || !dst)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "read_param: bad index %d (model has %d "
                       "params) or NULL destination", index, o->n_host);
    if (o->map[index] >= 0)
        return pt_store_read_param(rt->st, o->map[index], dst, bytes, err, errlen);
    const tgt *t = &o->t[o->tmap[index]];
    int64_t N = t->N, M = t->M, R = t->R;
    if (bytes != (uint64_t)(N * M) * 4)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "read_param: param %d holds %llu bytes, "
                       "caller passed %llu", index, (unsigned long long)(N * M * 4),
                       (unsigned long long)bytes);
    float *f = malloc((size_t)(N * R + R + R * M) * 4);
    if (!f) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "read_param: out of host memory");
    float *u = f, *s = u + N * R, *v = s + R;
    int rc = PT_OK;
    /* the factors, read as U [N x R] = [U_high | U_low], S, Vt = [V_high; V_low] */
    int64_t k = t->k, kl = t->kl;
    float *ub = malloc((size_t)(N * (k > kl ? k : kl)) * 4);
    if (!ub) rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "read_param: out of host memory");
    for (int part = 0; part < 2 && !rc; part++) {
        int64_t c0 = part ? k : 0, w = part ? kl : k;
        if (!w) continue;
        int base = part ? PT_OSFT_UL : PT_OSFT_UH;
        if ((rc = pt_store_read_param(rt->st, t->x[base], ub, (uint64_t)(N * w) * 4, err,
                                      errlen)) ||
            (rc = pt_store_read_param(rt->st, t->x[base + 1], s + c0, (uint64_t)w * 4, err,
                                      errlen)) ||
            (rc = pt_store_read_param(rt->st, t->x[base + 2], v + c0 * M, (uint64_t)(w * M) * 4,
                                      err, errlen)))
            break;
        for (int64_t r = 0; r < N; r++) memcpy(u + r * R + c0, ub + r * w, (size_t)w * 4);
    }
    free(ub);
    if (!rc) {
        /* W[r][:] = sum_j (U[r][j] S[j]) Vt[j][:], accumulated in fp32, j ascending */
        float *w = dst;
        memset(w, 0, (size_t)(N * M) * 4);
        for (int64_t r = 0; r < N; r++)
            for (int64_t j = 0; j < R; j++) {
                float us = u[r * R + j] * s[j];
                const float *vr = v + j * M;
                float *wr = w + r * M;
                for (int64_t c = 0; c < M; c++) wr[c] += us * vr[c];
            }
    }
    free(f);
    return rc;
}

static void trampoline(void *arg) {
    snap *sp = arg;
    tl_snap = sp;
    sp->fn(sp->arg);
    tl_snap = NULL;
    free(sp);
}

int pt_osft_launch(pt_rt *rt, void (*fn)(void *), void *arg, char *err, size_t errlen) {
    pt_osft *o = osft_of(rt);
    snap *sp = malloc(sizeof *sp + (size_t)o->n * sizeof(fptr));
    if (!sp) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "launch: out of host memory");
    sp->fn = fn;
    sp->arg = arg;
    sp->rt = rt;
    for (int i = 0; i < o->n; i++) pt_osft_live_ptrs(o, &o->t[i], &sp->f[i]);
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    if (ops->host_fn(pt_gpu_impl(rt->dev.gpu), rt->dev.s_compute, trampoline, sp)) {
        free(sp);
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "launch: queueing work on the compute stream failed: host_fn failed");
    }
    return PT_OK;
}

int pt_osft_in_launch(void) { return tl_snap != NULL; }
