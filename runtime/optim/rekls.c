/*
 * rekls.c — one REKLS step against a table of operations (see rekls.h for the
 * math), and the CPU table.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "la_cpu.h"
#include "rekls.h"
#include "rekls_ew.h"

#include "pt_util.h"
#include "protrain.h"

static int cpu_gemm(void *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    (void)ctx;
    pt_la_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return 0;
}
static int cpu_eigh(void *ctx, int n, float *A, float *w) {
    (void)ctx;
    return pt_la_eigh_desc(n, A, w) ? PT_ERR_BACKEND : 0;
}
static int cpu_ew(void *ctx, const pt_rekls_ew_args *a) {
    (void)ctx;
    pt_rekls_ew_range(a, 0, a->n);
    return 0;
}
static int cpu_copy(void *ctx, float *dst, const float *src, size_t n) {
    (void)ctx;
    memcpy(dst, src, n * sizeof *dst);
    return 0;
}
const pt_rekls_la pt_rekls_la_cpu = {NULL, cpu_gemm, cpu_eigh, cpu_ew, cpu_copy};

static int dev_gemm(void *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    pt_rekls_dev *d = ctx;
    pt_gemm_args g = {ta, tb, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc};
    return d->ops->gemm_f32(d->impl, &g, d->s);
}
static int dev_eigh(void *ctx, int n, float *A, float *w) {
    pt_rekls_dev *d = ctx;
    return d->ops->eigh(d->impl, n, A, w, d->status, d->s);
}
static int dev_ew(void *ctx, const pt_rekls_ew_args *a) {
    pt_rekls_dev *d = ctx;
    return d->ops->rekls_ew(d->impl, a, d->s);
}
static int dev_copy(void *ctx, float *dst, const float *src, size_t n) {
    pt_rekls_dev *d = ctx;
    return d->ops->memcpy_async(d->impl, dst, src, n * sizeof *dst, 2 /* PT_GPU_D2D */, d->s);
}

int pt_rekls_la_device(pt_rekls_dev *d, pt_rekls_la *la, char *err, size_t errlen) {
    if (!pt_gpu_has_linalg(d->ops) || !d->ops->eigh || !d->ops->rekls_ew)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "the %s backend has no gemm_f32 / eigh / rekls_ew ops, so REKLS cannot step "
                       "resident parameters on it",
                       d->ops->name);
    la->ctx = d;
    la->gemm = dev_gemm;
    la->eigh = dev_eigh;
    la->ew = dev_ew;
    la->copy = dev_copy;
    return PT_OK;
}

uint64_t pt_rekls_aux_words(uint64_t m, uint64_t n) { return 2 * m * m + 2 * n * n + m + n; }

uint64_t pt_rekls_ws_words(uint64_t m, uint64_t n) {
    uint64_t d = m > n ? m : n;
    return 2 * m * n + 2 * d * d;
}

pt_rekls_view pt_rekls_aux_view(float *aux, int m, int n) {
    size_t mm = (size_t)m * (size_t)m, nn = (size_t)n * (size_t)n;
    pt_rekls_view v;
    v.L = aux;
    v.R = v.L + mm;
    v.QL = v.R + nn;
    v.QR = v.QL + mm;
    v.lamL = v.QR + nn;
    v.lamR = v.lamL + m;
    return v;
}

void pt_rekls_aux_init_host(float *aux, int m, int n) {
    memset(aux, 0, (size_t)pt_rekls_aux_words((uint64_t)m, (uint64_t)n) * sizeof *aux);
    pt_rekls_view v = pt_rekls_aux_view(aux, m, n);
    for (int i = 0; i < m; i++) v.QL[(size_t)i * m + i] = 1.0f;
    for (int i = 0; i < n; i++) v.QR[(size_t)i * n + i] = 1.0f;
}

double pt_rekls_gemm_flops(uint64_t m, uint64_t n) {
    double M = (double)m, N = (double)n;
    /* factor update 2(m^3 + n^3) + 4(mn^2 + m^2 n); four two-sided products 8(m^2 n + mn^2) */
    return 2 * (M * M * M + N * N * N) + 12 * (M * M * N + M * N * N);
}

double pt_rekls_eigh_flops(uint64_t m, uint64_t n) {
    double M = (double)m, N = (double)n;
    return 9 * (M * M * M + N * N * N);
}

static double best3_gemm(int n, float *a, float *b, float *c) {
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = pt_now_s();
        pt_la_sgemm(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = pt_now_s() - t0;
        if (r == 0 || dt < best) best = dt;
    }
    return best;
}
static double best3_eigh(int n, const float *s, float *a, float *w) {
    double best = 0;
    for (int r = 0; r < 3; r++) {
        memcpy(a, s, (size_t)n * n * sizeof *a);
        double t0 = pt_now_s();
        pt_la_eigh_desc(n, a, w);
        double dt = pt_now_s() - t0;
        if (r == 0 || dt < best) best = dt;
    }
    return best;
}

void pt_rekls_measure_rates(pt_rekls_rates *r) {
    const int n1 = 64, n2 = 384;
    size_t nn = (size_t)n2 * n2;
    float *a = malloc(4 * nn * sizeof *a), *w = malloc((size_t)n2 * sizeof *w);
    r->gemm_call_s = r->eigh_call_s = 0;
    r->gemm_flops_per_s = r->eigh_flops_per_s = 1e9;   /* never a zero rate */
    if (!a || !w) {
        free(a);
        free(w);
        return;
    }
    float *b = a + nn, *c = b + nn, *s = c + nn;
    for (size_t i = 0; i < nn; i++) a[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    memcpy(b, a, nn * sizeof *a);
    double g1 = best3_gemm(n1, a, b, c), g2 = best3_gemm(n2, a, b, c);
    double f1 = 2.0 * n1 * n1 * n1, f2 = 2.0 * n2 * n2 * n2;
    if (g2 > g1) r->gemm_flops_per_s = (f2 - f1) / (g2 - g1);
    else if (g2 > 0) r->gemm_flops_per_s = f2 / g2;
    r->gemm_call_s = g1 - f1 / r->gemm_flops_per_s > 0 ? g1 - f1 / r->gemm_flops_per_s : 0;
    /* symmetric positive semi-definite inputs: a a^T at each size */
    double e[2];
    const int ns[2] = {n1, n2};
    for (int k = 0; k < 2; k++) {
        pt_la_sgemm(0, 1, ns[k], ns[k], ns[k], 1.0f, a, ns[k], a, ns[k], 0.0f, s, ns[k]);
        e[k] = best3_eigh(ns[k], s, c, w);
    }
    double q1 = 9.0 * n1 * n1 * n1, q2 = 9.0 * n2 * n2 * n2;
    if (e[1] > e[0]) r->eigh_flops_per_s = (q2 - q1) / (e[1] - e[0]);
    else if (e[1] > 0) r->eigh_flops_per_s = q2 / e[1];
    r->eigh_call_s = e[0] - q1 / r->eigh_flops_per_s > 0 ? e[0] - q1 / r->eigh_flops_per_s : 0;
    free(a);
    free(w);
}

double pt_rekls_predict_s(const pt_rekls_rates *r, double n_params, double gemm_flops,
                          double eigh_flops) {
    return n_params * (PT_REKLS_GEMM_CALLS * r->gemm_call_s + PT_REKLS_EIGH_CALLS * r->eigh_call_s) +
           gemm_flops / r->gemm_flops_per_s + eigh_flops / r->eigh_flops_per_s;
}

/* One table call; the first failure names its op and stops the step. */
#define TRY(call, what) \
    do { \
        int rc_ = (call); \
        if (rc_) \
            return pt_fail(err, errlen, rc_ < 0 ? PT_ERR_BACKEND : rc_, \
                           "REKLS step on a %d x %d parameter failed: %s failed", m, n, what); \
    } while (0)

static pt_rekls_ew_args ew0(int kind, size_t cnt) {
    pt_rekls_ew_args a;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    a.n = cnt;
    return a;
}

/* F = lerp(F, X, w): a factor's exponential average with this step's increment. */
static int lerp_factor(const pt_rekls_la *la, float *F, const float *X, size_t len, float w) {
    pt_rekls_ew_args a = ew0(PT_RK_LERP, len);
    a.x = F;
    a.y = X;
    a.a = w;
    return la->ew(la->ctx, &a);
}

/* C = Q diag(1/(d max(lam, eps))) Q^T [d x d], the inverse of the other factor in
 * its (old) eigenbasis; X is scratch. */
static int inverse_factor(const pt_rekls_la *la, const float *Q, const float *lam, int d,
                          float eps, float *X, float *C) {
    pt_rekls_ew_args a = ew0(PT_RK_SCALE_COLS, (size_t)d * (size_t)d);
    a.x = X;
    a.y = Q;
    a.lam = lam;
    a.cols = (size_t)d;
    a.b = (float)d;
    a.c0 = eps;
    int rc = la->ew(la->ctx, &a);
    return rc ? rc : la->gemm(la->ctx, 0, 1, d, d, d, 1.0f, X, d, Q, d, 0.0f, C, d);
}

/* Steps 2-8 on a gradient already in G (fp32, scaled), the factors, bases and
 * eigenvalues in s (bases and eigenvalues those of the previous step), the
 * moments M, V: leaves the update D in G. T [mn], C and X [max(m,n)^2]. */
float pt_rekls_decay(const pt_rekls_hyper *h) {
    double lr = h->lr, wd = h->weight_decay;
    if (wd == 0) return 0.0f;
    switch (h->wd_mode) {
    case PT_REKLS_WD_INDEPENDENT: return (float)wd;
    case PT_REKLS_WD_L2: return 0.0f;
    case PT_REKLS_WD_PALM: return (float)(lr * lr * wd);
    default: return (float)(lr * wd);
    }
}

int pt_rekls_core(const pt_rekls_la *la, const pt_rekls_hyper *h, int m, int n,
                  pt_rekls_view s, float *M, float *V, float *G, const float *W, float *T,
                  float *C, float *X, char *err, size_t errlen) {
    const size_t mn = (size_t)m * (size_t)n, mm = (size_t)m * (size_t)m, nn = (size_t)n * (size_t)n;
    void *c = la->ctx;
    pt_rekls_ew_args a;
    /* 2. weight of the new increment, 1 - beta_hat (double, rounded once) */
    double bs = h->shampoo_beta;
    float w = (float)((1.0 - bs) / (1.0 - pow(bs, (double)h->k)));

    /* 3. factors */
    if (h->k == 1 && h->seed_shampoo) {
        TRY(la->gemm(c, 0, 1, m, m, n, 1.0f / (float)n, G, n, G, n, 0.0f, X, m), "gemm");
        TRY(lerp_factor(la, s.L, X, mm, w), "rekls_ew (factor average)");
        TRY(la->gemm(c, 1, 0, n, n, m, 1.0f / (float)m, G, n, G, n, 0.0f, X, n), "gemm");
        TRY(lerp_factor(la, s.R, X, nn, w), "rekls_ew (factor average)");
    } else {
        /* X_L = G C_R G^T, C_R = (Q_R diag(d_R)) Q_R^T; only old bases are read,
         * so writing L before forming X_R is still the Jacobi update */
        TRY(inverse_factor(la, s.QR, s.lamR, n, h->eps, X, C),
            "rekls_ew or gemm (inverse of the right factor)");
        TRY(la->gemm(c, 0, 0, m, n, n, 1.0f, G, n, C, n, 0.0f, T, n), "gemm");
        TRY(la->gemm(c, 0, 1, m, m, n, 1.0f, T, n, G, n, 0.0f, X, m), "gemm");
        TRY(lerp_factor(la, s.L, X, mm, w), "rekls_ew (factor average)");
        /* X_R = G^T C_L G, C_L = (Q_L diag(d_L)) Q_L^T */
        TRY(inverse_factor(la, s.QL, s.lamL, m, h->eps, X, C),
            "rekls_ew or gemm (inverse of the left factor)");
        TRY(la->gemm(c, 1, 0, n, m, m, 1.0f, G, n, C, m, 0.0f, T, m), "gemm");   /* [n x m] */
        TRY(la->gemm(c, 0, 0, n, n, m, 1.0f, T, m, G, n, 0.0f, X, n), "gemm");
        TRY(lerp_factor(la, s.R, X, nn, w), "rekls_ew (factor average)");
    }

    /* 4. M_w = Q_L M Q_R^T (old bases), new bases by eigh, M = Q_L^T M_w Q_R */
    TRY(la->gemm(c, 0, 0, m, n, m, 1.0f, s.QL, m, M, n, 0.0f, T, n), "gemm");
    TRY(la->gemm(c, 0, 1, m, n, n, 1.0f, T, n, s.QR, n, 0.0f, M, n), "gemm");
    TRY(la->copy(c, s.QL, s.L, mm), "copy");
    TRY(la->eigh(c, m, s.QL, s.lamL), "eigh of the left factor (fp32 and fp64)");
    TRY(la->copy(c, s.QR, s.R, nn), "copy");
    TRY(la->eigh(c, n, s.QR, s.lamR), "eigh of the right factor (fp32 and fp64)");
    TRY(la->gemm(c, 1, 0, m, n, m, 1.0f, s.QL, m, M, n, 0.0f, T, n), "gemm");
    TRY(la->gemm(c, 0, 0, m, n, n, 1.0f, T, n, s.QR, n, 0.0f, M, n), "gemm");

    /* 5. l2 decay: G += wd W, after the factors took G (the reference adds it
     * here, so the factors stay statistics of the loss gradient and only Adam
     * sees the decay); the other modes shrink W in step 9 */
    if (h->wd_mode == PT_REKLS_WD_L2 && h->weight_decay != 0) {
        if (!W)
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "REKLS step on a %d x %d parameter: l2 weight decay needs the "
                           "weights, none given",
                           m, n);
        a = ew0(PT_RK_AXPY, mn);
        a.x = G;
        a.y = W;
        a.a = h->weight_decay;
        TRY(la->ew(c, &a), "rekls_ew (l2 decay)");
    }

    /* 6. G~ = Q_L^T G Q_R (into G) */
    TRY(la->gemm(c, 1, 0, m, n, m, 1.0f, s.QL, m, G, n, 0.0f, T, n), "gemm");
    TRY(la->gemm(c, 0, 0, m, n, n, 1.0f, T, n, s.QR, n, 0.0f, G, n), "gemm");

    /* 7. Adam in the eigenbasis: G becomes U */
    double k = (double)h->k;
    a = ew0(PT_RK_ADAM, mn);
    a.x = G;
    a.m = M;
    a.v = V;
    a.a = 1.0f - h->beta1;
    a.b = 1.0f - h->beta2;
    a.c0 = (float)(1.0 - pow((double)h->beta1, k));
    a.c1 = (float)(1.0 - pow((double)h->beta2, k));
    a.c2 = h->eps;
    TRY(la->ew(c, &a), "rekls_ew (Adam)");

    /* 8. D = Q_L U Q_R^T (into G) */
    TRY(la->gemm(c, 0, 0, m, n, m, 1.0f, s.QL, m, G, n, 0.0f, T, n), "gemm");
    TRY(la->gemm(c, 0, 1, m, n, n, 1.0f, T, n, s.QR, n, 0.0f, G, n), "gemm");

    return PT_OK;
}

int pt_rekls_step(const pt_rekls_la *la, const pt_rekls_hyper *h, const pt_rekls_tensors *x,
                  char *err, size_t errlen) {
    const int m = x->m, n = x->n;
    if (m < 1 || n < 1 || h->k < 1)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "REKLS step: shape %d x %d or step %lld is not positive", m, n,
                       (long long)h->k);
    const size_t mn = (size_t)m * (size_t)n, mm = (size_t)m * (size_t)m, nn = (size_t)n * (size_t)n;
    const size_t d2 = mm > nn ? mm : nn;
    pt_rekls_view s = pt_rekls_aux_view(x->aux, m, n);
    float *G = x->ws, *T = G + mn, *C = T + mn, *X = C + d2;   /* [mn] [mn] [d^2] [d^2] */
    void *c = la->ctx;
    pt_rekls_ew_args a;

    /* 1. G = grad * grad_scale (fp32) */
    a = ew0(PT_RK_GRAD_IN, mn);
    a.x = G;
    a.src = x->grad;
    a.src_dtype = x->grad_dtype;
    a.a = h->grad_scale;
    TRY(la->ew(c, &a), "rekls_ew (gradient in)");
    int rc = pt_rekls_core(la, h, m, n, s, x->M, x->V, G, x->param, T, C, X, err, errlen);
    if (rc) return rc;

    /* 5 + 9. W = W - c W - lr D (c per decay mode; G~ does not read W, so the
     * decay may wait until here) */
    a = ew0(PT_RK_APPLY, mn);
    a.x = x->param;
    a.y = G;
    a.dst = x->param_out;
    a.dst_dtype = x->out_dtype;
    a.a = h->lr;
    a.c0 = pt_rekls_decay(h);
    TRY(la->ew(c, &a), "rekls_ew (update)");
    return PT_OK;
}
