/*
 * test_sh_grad.c — gradient checks of sample_host's layers and of the whole tiny model:
 * analytic backward against central finite differences (f(x+e) - f(x-e)) / 2e.
 *
 * Objective: J = sum_i w_i * out_i with fixed random w (every output and direction
 * matters), accumulated in double; the kernels run in fp32 with e = 1e-2 on inputs of
 * O(1). Error of a tensor: max_i |a_i - n_i| / max_i |a_i| (relative to its scale).
 * Why the bounds are tight enough and loose enough:
 *  - fp32 rounding of the outputs one perturbation touches is ~6e-8 relative; over a row
 *    of <= 35 O(1) outputs that is ~4e-7 in J, i.e. ~2e-5 in the difference quotient
 *    (/2e); the truncation error e^2/6 * f''' is ~2e-5 for O(1) curvature. Measured:
 *    layers <= 3e-5 (e = 1e-3 gives ~3e-4: rounding noise grows as 1/e);
 *  - a wrong transpose, a missing term or a wrong factor gives errors of O(1)
 *    (checked by hand-injected bugs: dropped LayerNorm mean term, missing softmax
 *    scale, halved embedding gradient: each fails its layer test and the model test).
 * So layers assert < 1e-3. The whole model (sum over B*T positions through two blocks,
 * more rounding on the way) is checked per tensor with ||a - n|| / ||a|| < 1e-2 over
 * sampled entries (measured <= 8e-4), which still fails for any dropped path (residual,
 * tie, head), where the error is O(1).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sh_data.h"
#include "sh_gpt.h"
#include "sh_layers.h"
#include "sh_rng.h"
#include "sh_train.h"

#define EPS 1e-2f
#define LAYER_BOUND 1e-3
#define MODEL_BOUND 1e-2

static sh_rng R;

static void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)sh_rng_uniform(&R);
}

static double dotw(const float *w, const float *o, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)w[i] * (double)o[i];
    return s;
}

/* Error of analytic a against numeric n over k entries, relative to the gradient's
 * scale: max_i |a_i - n_i| / max_i |a_i|. */
static double max_err(const double *a, const double *n, size_t k) {
    double amax = 0.0, worst = 0.0;
    for (size_t i = 0; i < k; i++) amax = fmax(amax, fabs(a[i]));
    for (size_t i = 0; i < k; i++) worst = fmax(worst, fabs(a[i] - n[i]));
    return worst / (amax + 1e-30);
}

/* Generic check: x (n floats) is an input of f; ga the analytic gradient of J wrt x. */
typedef double (*objective)(void *u);
static double check_input(const char *what, float *x, const float *ga, size_t n, objective f,
                          void *u) {
    double *a = malloc(n * sizeof *a), *num = malloc(n * sizeof *num);
    assert_non_null(a);
    assert_non_null(num);
    for (size_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + EPS;
        double fp = f(u);
        x[i] = keep - EPS;
        double fm = f(u);
        x[i] = keep;
        num[i] = (fp - fm) / (2.0 * (double)EPS);
        a[i] = ga[i];
    }
    double e = max_err(a, num, n);
    printf("  %-28s max rel err %.2e over %zu entries\n", what, e, n);
    free(a);
    free(num);
    return e;
}

/* ---- layernorm ---- */
typedef struct {
    int N, C;
    float *x, *w, *b, *out, *mean, *rstd, *wout;
} ln_case;
static double ln_obj(void *u) {
    ln_case *c = u;
    sh_layers_layernorm_fwd(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C);
    return dotw(c->wout, c->out, (size_t)c->N * c->C);
}
static void test_layernorm(void **st) {
    (void)st;
    ln_case c = {.N = 6, .C = 16};
    size_t nc = (size_t)c.N * c.C;
    /* x, out, wout, dx (N,C) | w, b, dw, db (C) | mean, rstd (N) */
    float *buf = calloc(4 * nc + 4 * (size_t)c.C + 2 * (size_t)c.N, sizeof(float));
    c.x = buf;
    c.out = buf + nc;
    c.wout = buf + 2 * nc;
    float *dx = buf + 3 * nc;
    c.w = buf + 4 * nc;
    c.b = c.w + c.C;
    float *dw = c.b + c.C, *db = dw + c.C;
    c.mean = db + c.C;
    c.rstd = c.mean + c.N;
    fill(c.x, nc, -2, 2);
    fill(c.w, (size_t)c.C, 0.5f, 1.5f);
    fill(c.b, (size_t)c.C, -1, 1);
    fill(c.wout, nc, -1, 1);
    ln_obj(&c);
    sh_layers_layernorm_bwd(dx, dw, db, c.wout, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    assert_true(check_input("layernorm dinp", c.x, dx, nc, ln_obj, &c) < LAYER_BOUND);
    assert_true(check_input("layernorm dw", c.w, dw, (size_t)c.C, ln_obj, &c) < LAYER_BOUND);
    assert_true(check_input("layernorm db", c.b, db, (size_t)c.C, ln_obj, &c) < LAYER_BOUND);
    /* everything accumulates: a second backward doubles dinp, and dw, db get exactly
     * their own sum added once (g + S, with S = g here) */
    float first = dx[3];
    float w0[16], b0[16];
    memcpy(w0, dw, sizeof w0);
    memcpy(b0, db, sizeof b0);
    sh_layers_layernorm_bwd(dx, dw, db, c.wout, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    assert_float_equal(dx[3], 2.0f * first, 1e-6f * fabsf(first) + 1e-12f);
    for (int k = 0; k < c.C; k++) {
        assert_true(dw[k] == w0[k] + w0[k]);
        assert_true(db[k] == b0[k] + b0[k]);
    }
    free(buf);
}

/* ---- matmul ---- */
typedef struct {
    int N, IC, OC;
    float *x, *W, *bias, *out, *wout;
} mm_case;
static double mm_obj(void *u) {
    mm_case *c = u;
    sh_layers_matmul_fwd(c->out, c->x, c->W, c->bias, c->N, c->IC, c->OC);
    return dotw(c->wout, c->out, (size_t)c->N * c->OC);
}
static void run_matmul(int N, int IC, int OC) {
    mm_case c = {.N = N, .IC = IC, .OC = OC};
    size_t nx = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
    c.x = malloc(nx * 4);
    c.W = malloc(nw * 4);
    c.bias = malloc((size_t)OC * 4);
    c.out = malloc(no * 4);
    c.wout = malloc(no * 4);
    float *dx = malloc(nx * 4), *dW = calloc(nw, 4), *db = calloc((size_t)OC, 4);
    float *wtmp = malloc(nw * 4);
    fill(c.x, nx, -1, 1);
    fill(c.W, nw, -1, 1);
    fill(c.bias, (size_t)OC, -1, 1);
    fill(c.wout, no, -1, 1);
    mm_obj(&c);
    sh_layers_matmul_bwd(dx, dW, db, c.wout, c.x, c.W, N, IC, OC, wtmp);
    /* accumulation order: from a non-zero gradient g0 the result is exactly g0 + S, S
     * the result from zero (what a plugin summing micro-batch totals computes) */
    float *g0 = malloc(nw * 4), *b0 = malloc((size_t)OC * 4);
    float *ga = malloc(nw * 4), *ba = malloc((size_t)OC * 4);
    fill(g0, nw, -1, 1);
    fill(b0, (size_t)OC, -1, 1);
    memcpy(ga, g0, nw * 4);
    memcpy(ba, b0, (size_t)OC * 4);
    sh_layers_matmul_bwd(NULL, ga, ba, c.wout, c.x, c.W, N, IC, OC, wtmp);
    for (size_t k = 0; k < nw; k++) assert_true(ga[k] == g0[k] + dW[k]);
    for (int k = 0; k < OC; k++) assert_true(ba[k] == b0[k] + db[k]);
    /* without scratch the GEMM accumulates in place: same value up to rounding */
    memcpy(ga, g0, nw * 4);
    sh_layers_matmul_bwd(NULL, ga, NULL, c.wout, c.x, c.W, N, IC, OC, NULL);
    for (size_t k = 0; k < nw; k++) assert_true(fabsf(ga[k] - (g0[k] + dW[k])) <= 1e-5f);
    free(g0);
    free(b0);
    free(ga);
    free(ba);
    char nm[64];
    snprintf(nm, sizeof nm, "matmul %dx%dx%d dinp", N, IC, OC);
    assert_true(check_input(nm, c.x, dx, nx, mm_obj, &c) < LAYER_BOUND);
    snprintf(nm, sizeof nm, "matmul %dx%dx%d dW", N, IC, OC);
    assert_true(check_input(nm, c.W, dW, nw, mm_obj, &c) < LAYER_BOUND);
    snprintf(nm, sizeof nm, "matmul %dx%dx%d dbias", N, IC, OC);
    assert_true(check_input(nm, c.bias, db, (size_t)OC, mm_obj, &c) < LAYER_BOUND);
    free(c.x);
    free(c.W);
    free(c.bias);
    free(c.out);
    free(c.wout);
    free(dx);
    free(dW);
    free(db);
    free(wtmp);
}
static void test_matmul(void **st) {
    (void)st;
    run_matmul(5, 7, 9);   /* non-square: a swapped transpose cannot pass */
    run_matmul(70, 6, 35); /* several row slabs with a short last one, both ways */
}

/* ---- attention ---- */
typedef struct {
    int B, T, C, NH;
    float *qkv, *out, *att, *wout;
} at_case;
static double at_obj(void *u) {
    at_case *c = u;
    sh_layers_attention_fwd(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return dotw(c->wout, c->out, (size_t)c->B * c->T * c->C);
}
static void test_attention(void **st) {
    (void)st;
    at_case c = {.B = 2, .T = 5, .C = 8, .NH = 2};
    size_t nq = (size_t)c.B * c.T * 3 * c.C, no = (size_t)c.B * c.T * c.C;
    size_t na = (size_t)c.B * c.NH * c.T * c.T;
    int slots = sh_layers_attention_slots();
    c.qkv = malloc(nq * 4);
    c.out = malloc(no * 4);
    c.att = malloc(na * 4);
    c.wout = malloc(no * 4);
    float *dqkv = malloc(nq * 4), *datt = malloc((size_t)slots * c.T * c.T * 4);
    fill(c.qkv, nq, -1.5f, 1.5f);
    fill(c.wout, no, -1, 1);
    at_obj(&c);
    /* causal: probabilities above the diagonal are exactly 0, rows sum to 1 */
    for (int r = 0; r < c.B * c.NH * c.T; r++) {
        int t = r % c.T;
        double s = 0.0;
        for (int t2 = 0; t2 < c.T; t2++) {
            float p = c.att[(size_t)r * c.T + t2];
            if (t2 > t) assert_true(p == 0.0f);
            s += p;
        }
        assert_true(fabs(s - 1.0) < 1e-5);
    }
    memset(dqkv, 0xff, nq * 4); /* NaN garbage: backward must overwrite every entry */
    sh_layers_attention_bwd(dqkv, datt, slots, c.wout, c.qkv, c.att, c.B, c.T, c.C, c.NH);
    assert_true(check_input("attention dqkv", c.qkv, dqkv, nq, at_obj, &c) < LAYER_BOUND);
    free(c.qkv);
    free(c.out);
    free(c.att);
    free(c.wout);
    free(dqkv);
    free(datt);
}

/* ---- gelu ---- */
typedef struct {
    size_t n;
    float *x, *out, *wout;
} ge_case;
static double ge_obj(void *u) {
    ge_case *c = u;
    sh_layers_gelu_fwd(c->out, c->x, c->n);
    return dotw(c->wout, c->out, c->n);
}
static void test_gelu(void **st) {
    (void)st;
    ge_case c = {.n = 64};
    c.x = malloc(c.n * 4);
    c.out = malloc(c.n * 4);
    c.wout = malloc(c.n * 4);
    float *dx = malloc(c.n * 4);
    fill(c.x, c.n, -4, 4);
    fill(c.wout, c.n, -1, 1);
    ge_obj(&c);
    /* spot values of the tanh form: gelu(1) = 0.841192, gelu(-1) = -0.158808 */
    float xs[2] = {1.0f, -1.0f}, ys[2];
    sh_layers_gelu_fwd(ys, xs, 2);
    assert_float_equal(ys[0], 0.841192f, 1e-5f);
    assert_float_equal(ys[1], -0.158808f, 1e-5f);
    sh_layers_gelu_bwd(dx, c.x, c.wout, c.n);
    assert_true(check_input("gelu dinp", c.x, dx, c.n, ge_obj, &c) < LAYER_BOUND);
    free(c.x);
    free(c.out);
    free(c.wout);
    free(dx);
}

/* ---- softmax cross-entropy ---- */
typedef struct {
    int N, V, Vp;
    float *z, *p, *losses;
    int32_t *y;
} ce_case;
static double ce_obj(void *u) {
    ce_case *c = u;
    memcpy(c->p, c->z, sizeof(float) * (size_t)c->N * c->Vp);
    return sh_layers_crossentropy_fwd(c->p, c->losses, c->y, c->N, c->V, c->Vp);
}
static void test_crossentropy(void **st) {
    (void)st;
    ce_case c = {.N = 4, .V = 10, .Vp = 16};
    size_t nz = (size_t)c.N * c.Vp;
    c.z = malloc(nz * 4);
    c.p = malloc(nz * 4);
    c.losses = malloc((size_t)c.N * 4);
    c.y = malloc((size_t)c.N * 4);
    float *dz = malloc(nz * 4);
    fill(c.z, nz, -3, 3);
    for (int n = 0; n < c.N; n++) c.y[n] = (n * 7) % c.V;
    double loss = ce_obj(&c);
    /* reference in double: mean of log-sum-exp minus the target logit, over V only */
    double ref = 0.0;
    for (int n = 0; n < c.N; n++) {
        double s = 0.0;
        for (int i = 0; i < c.V; i++) s += exp((double)c.z[(size_t)n * c.Vp + i]);
        ref += log(s) - c.z[(size_t)n * c.Vp + c.y[n]];
    }
    assert_true(fabs(loss - ref / c.N) < 1e-5);
    sh_layers_crossentropy_bwd(dz, c.p, c.y, 1.0f / (float)c.N, c.N, c.V, c.Vp);
    assert_true(check_input("crossentropy dlogits", c.z, dz, nz, ce_obj, &c) < LAYER_BOUND);
    for (int n = 0; n < c.N; n++)
        for (int i = c.V; i < c.Vp; i++) assert_true(dz[(size_t)n * c.Vp + i] == 0.0f);
    free(c.z);
    free(c.p);
    free(c.losses);
    free(c.y);
    free(dz);
}

/* ---- embedding ---- */
typedef struct {
    int B, T, C;
    int32_t *tok;
    float *wte, *wpe, *out, *wout;
} en_case;
static double en_obj(void *u) {
    en_case *c = u;
    sh_layers_encoder_fwd(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return dotw(c->wout, c->out, (size_t)c->B * c->T * c->C);
}
static void test_embedding(void **st) {
    (void)st;
    en_case c = {.B = 2, .T = 3, .C = 20};
    int V = 5;
    int32_t tok[6] = {1, 3, 1, 4, 1, 0}; /* token 1 repeats: its row sums 3 positions */
    c.tok = tok;
    size_t no = (size_t)c.B * c.T * c.C;
    c.wte = malloc((size_t)V * c.C * 4);
    c.wpe = malloc((size_t)c.T * c.C * 4);
    c.out = malloc(no * 4);
    c.wout = malloc(no * 4);
    float *dwte = calloc((size_t)V * c.C, 4), *dwpe = calloc((size_t)c.T * c.C, 4);
    fill(c.wte, (size_t)V * c.C, -1, 1);
    fill(c.wpe, (size_t)c.T * c.C, -1, 1);
    fill(c.wout, no, -1, 1);
    en_obj(&c);
    sh_layers_encoder_bwd(dwte, dwpe, c.wout, c.tok, c.B, c.T, c.C);
    assert_true(check_input("embedding dwte", c.wte, dwte, (size_t)V * c.C, en_obj, &c) <
                LAYER_BOUND);
    assert_true(check_input("embedding dwpe", c.wpe, dwpe, (size_t)c.T * c.C, en_obj, &c) <
                LAYER_BOUND);
    for (int k = 0; k < c.C; k++) assert_true(dwte[2 * c.C + k] == 0.0f); /* unused token */
    free(c.wte);
    free(c.wpe);
    free(c.out);
    free(c.wout);
    free(dwte);
    free(dwpe);
}

/* ---- whole tiny model through the trainer (no plugin) ---- */
typedef struct {
    sh_trainer *tr;
    int32_t *inp, *tgt;
} md_case;
static double md_obj(void *u) {
    md_case *c = u;
    double loss = 0.0;
    assert_int_equal(sh_trainer_fwdbwd(c->tr, c->inp, c->tgt, 0, &loss), 0);
    return loss;
}
static void test_model(void **st) {
    (void)st;
    enum { B = 2,
           T = 8 };
    sh_tokens all = {0}, tr_tok, va_tok;
    all.n = 400;
    all.tok = malloc(all.n * sizeof(uint16_t));
    for (size_t i = 0; i < all.n; i++) all.tok[i] = (uint16_t)(sh_rng_next(&R) % 16);
    sh_data_split(&all, &tr_tok, &va_tok);
    sh_train_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (sh_dims){.V = 16, .Vp = 0, .maxT = 8, .L = 2, .NH = 2, .C = 8};
    o.B = B;
    o.T = T;
    o.n_micro = 1;
    o.seed = 7;
    o.lr = 1e-3f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.train = &tr_tok;
    o.val = &va_tok;
    sh_trainer *tr = NULL;
    char err[512];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    const sh_model *m = sh_trainer_model(tr);
    /* larger weights than GPT-2's 0.02 so every path carries a sizeable gradient */
    for (int i = 0; i < m->n_params; i++) {
        const pt_param_v1 *p = &m->params[i];
        if (p->tie >= 0) continue;
        float *x = p->data;
        size_t n = sh_model_param_numel(p);
        size_t live = i == SH_P_WTE ? (size_t)m->d.V * m->d.C : n;
        for (size_t k = 0; k < live; k++) x[k] += 0.3f * (float)(sh_rng_uniform(&R) - 0.5);
    }
    int32_t inp[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        inp[i] = (int32_t)(sh_rng_next(&R) % 16);
        tgt[i] = (int32_t)(sh_rng_next(&R) % 16);
    }
    md_case c = {tr, inp, tgt};
    sh_trainer_zero_grads(tr);
    double loss = 0.0;
    assert_int_equal(sh_trainer_fwdbwd(tr, inp, tgt, 1, &loss), 0);
    assert_true(loss > 0.0 && isfinite(loss));
    enum { K = 24 };
    for (int i = 0; i < m->n_params; i++) {
        const pt_param_v1 *p = &m->params[i];
        if (p->tie >= 0) {
            assert_ptr_equal(p->data, m->params[p->tie].data); /* the head shares wte */
            continue;
        }
        float *x = p->data;
        const float *g = p->grad;
        size_t n = sh_model_param_numel(p);
        size_t live = i == SH_P_WTE ? (size_t)m->d.V * m->d.C : n;
        for (size_t k = live; k < n; k++) assert_true(g[k] == 0.0f); /* padded vocab rows */
        double a[K], num[K], da = 0.0, dd = 0.0;
        int cnt = live < K ? (int)live : K;
        for (int k = 0; k < cnt; k++) {
            size_t j = live <= K ? (size_t)k : (size_t)(sh_rng_next(&R) % live);
            float keep = x[j];
            x[j] = keep + EPS;
            double fp = md_obj(&c);
            x[j] = keep - EPS;
            double fm = md_obj(&c);
            x[j] = keep;
            num[k] = (fp - fm) / (2.0 * (double)EPS);
            a[k] = g[j];
            da += a[k] * a[k];
            dd += (a[k] - num[k]) * (a[k] - num[k]);
        }
        double rel = sqrt(dd) / (sqrt(da) + 1e-12);
        printf("  model %-14s ||a-n||/||a|| %.2e  (||a|| %.2e, %d entries)\n", p->name, rel,
               sqrt(da), cnt);
        assert_true(sqrt(da) > 1e-6); /* every tensor receives gradient */
        assert_true(rel < MODEL_BOUND);
    }
    sh_trainer_destroy(tr);
    sh_data_tokens_free(&all);
}

int main(void) {
    sh_rng_seed(&R, 12345, 99);
    sh_layers_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests_name("sample_host gradient checks", tests, NULL, NULL);
}
