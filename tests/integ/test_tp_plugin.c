/*
 * test_tp_plugin.c — tensor-parallel REKLS through the plugin's hooks.
 *
 * A hook-level host (this file) declares three block weights, FULL shapes
 *   b0.w 16 x 32 split along rows    (tp_split 1: each rank holds 16/P x 32),
 *   b1.w 32 x 16 split along columns (tp_split 2: each rank holds 32 x 16/P),
 *   b2.w 24 x 40 replicated          (tp_split 0: every rank holds all of it),
 * with [dist] tp_size = P = the number of ranks (1 under make test; 2 and 4
 * under mpirun in tests/dist.sh). Every step the gradient of full element
 * (i, j) is f(param, step, i, j) + 0.01 w(i, j); a rank writes the elements of
 * its shard. The oracle, inside the test, is single-rank REKLS (pt_rekls_step)
 * on the full matrices from the same initial values; after each of 5 steps
 * every rank's shard (read back with read_param) must be bit-identical to the
 * oracle's rows / columns, for
 *   - every chunk resident (the step reads device memory, host memory here),
 *   - every chunk offloaded (the gradient from the fp32 accumulator),
 *   - offloaded with global-norm clipping: the plugin's reported norm must equal
 *     the full matrices' norm (within 1e-6 relative: the sum order differs) and
 *     the oracle, given the clip factor computed from that norm as the plugin
 *     does, must again match bit for bit. Negative control (P > 1): counting
 *     only this rank's shards gives another norm, so the check sees the group sum.
 * Negative control for the shard comparison: an oracle with another shampoo beta
 * differs. Refusals: a split weight whose full shape does not divide by P (at
 * P > 1), tp_size not dividing world_size, tp_size > 1 with OSFT, a bad
 * tp_split value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"
#include "optim/optim.h"
#include "protrain.h"

static const pt_plugin_v1 *PL = &protrain_plugin_v1;
static pt_coll *COLL;
static int WORLD = 1, RANK = 0;

enum { NW = 3, STEPS = 5 };
static const int FM[NW] = {16, 32, 24}, FN[NW] = {32, 16, 40}, SPLIT[NW] = {1, 2, 0};

typedef struct host {
    void *ctx;
    int P, r, k;               /* group size, rank, the step being run */
    int lm[NW], ln[NW];        /* local shapes */
    pt_param_v1 p[NW];
    pt_model_v1 m;
    float *init[NW];
} host;

static float gfun(int w, int k, int i, int j) {
    return sinf(0.37f * (float)(i * 41 + j) + 1.3f * (float)k + (float)w) * 0.5f;
}
static float winit(int w, int i, int j) { return 0.02f * cosf(0.11f * (float)(i * 53 + j * 7 + w)); }
/* full index of local element (i, j) of weight w on rank r */
static int fi(const host *h, int w, int i) { return SPLIT[w] == 1 ? h->r * h->lm[w] + i : i; }
static int fj(const host *h, int w, int j) { return SPLIT[w] == 2 ? h->r * h->ln[w] + j : j; }

static int32_t pass(void *user) {
    host *h = user;
    double loss = 0;
    for (int b = 0; b < NW; b++) {
        int rc = PL->block_pre_forward(h->ctx, b);
        if (rc) return rc;
        loss += ((const float *)h->p[b].data)[0];
        if ((rc = PL->block_post_forward(h->ctx, b))) return rc;
    }
    for (int b = NW - 1; b >= 0; b--) {
        int rc = PL->block_pre_backward(h->ctx, b);
        if (rc) return rc;
        float *g = h->p[b].grad;
        const float *x = h->p[b].data;
        for (int i = 0; i < h->lm[b]; i++)
            for (int j = 0; j < h->ln[b]; j++) {
                size_t e = (size_t)i * h->ln[b] + j;
                g[e] += gfun(b, h->k, fi(h, b, i), fj(h, b, j)) + 0.01f * x[e];
            }
        if ((rc = PL->block_post_backward(h->ctx, b))) return rc;
    }
    return isfinite(loss) ? 0 : PT_ERR_INTERNAL;
}
static int32_t recompute(void *user, int32_t b) { (void)user, (void)b; return 0; }
static void hlog(void *user, int32_t level, const char *msg) {
    (void)user, (void)level;
    if (getenv("TP_LOG")) fprintf(stderr, "[rank %d] %s\n", RANK, msg);
}

/* init + post_model_load; returns the failing hook's code (0: started). split0:
 * b0.w's split (for the bad-value case); cols0: b0.w's full column count. */
static int start(host *h, int P, const char *extra, int split0, int cols0) {
    memset(h, 0, sizeof *h);
    h->P = P;
    h->r = P > 1 ? RANK : 0;
    static char names[NW][16];
    for (int w = 0; w < NW; w++) {
        int fm = FM[w], fn = w == 0 ? cols0 : FN[w];
        h->lm[w] = SPLIT[w] == 1 ? fm / P : fm;
        h->ln[w] = SPLIT[w] == 2 ? fn / P : fn;
        h->init[w] = malloc(sizeof(float) * (size_t)h->lm[w] * h->ln[w]);
        assert_non_null(h->init[w]);
        for (int i = 0; i < h->lm[w]; i++)
            for (int j = 0; j < h->ln[w]; j++)
                h->init[w][(size_t)i * h->ln[w] + j] = winit(w, fi(h, w, i), fj(h, w, j));
        snprintf(names[w], sizeof names[w], "b%d.w", w);
        h->p[w] = (pt_param_v1){.name = names[w], .dtype = PT_F32, .ndim = 2,
                                .shape = {h->lm[w], h->ln[w]}, .block = w, .trainable = 1,
                                .tie = -1, .tp_split = w == 0 ? split0 : SPLIT[w],
                                .init = h->init[w]};
    }
    h->m = (pt_model_v1){.struct_size = sizeof h->m, .n_params = NW, .params = h->p,
                         .n_blocks = NW, .batch = 1, .seq = 1, .arch = "tp-hooks"};
    char path[] = "/tmp/pt_tp_plugin_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "[plugin]\nbackend = host\nlog_level = %s\n[optimizer]\ncpu_threads = 1\n"
                     "[dist]\ntimeout = 60\ntp_size = %d\n%s\n",
                     getenv("TP_LOG") ? "info" : "error", P, extra);
    assert_int_equal(write(fd, text, (size_t)n), n);
    close(fd);
    pt_host_v1 hs;
    memset(&hs, 0, sizeof hs);
    hs.abi_version = PT_ABI_VERSION;
    hs.struct_size = sizeof hs;
    hs.world_size = WORLD;
    hs.rank = RANK;
    hs.local_rank = RANK;
    hs.user = h;
    hs.profile_step = pass;
    hs.log = hlog;
    hs.recompute_block = recompute;
    int rc = PL->init(path, &hs, &h->ctx);
    unlink(path);
    if (rc) return rc;
    return PL->post_model_load(h->ctx, &h->m);
}

static void stop(host *h) {
    if (h->ctx) assert_int_equal(PL->finalize(h->ctx), PT_OK);
    for (int w = 0; w < NW; w++) free(h->init[w]);
}

static int create_opt(host *h, float max_norm) {
    pt_optim_v1 od = {.struct_size = sizeof od, .type = PT_OPTIM_REKLS, .lr = 1e-3f,
                      .beta1 = 0.9f, .beta2 = 0.95f, .eps = NAN, .weight_decay = 0.01f,
                      .max_grad_norm = max_norm};
    return PL->create_optimizer(h->ctx, &od);
}

/* One placement: P ranks vs the oracle over STEPS steps. Returns 1 when every
 * shard matched every step; *norm_err: the largest relative norm difference. */
static int run(const char *placement, float max_norm, float oracle_bs, double *norm_err) {
    host h;
    int P = WORLD;
    if (start(&h, P, placement, SPLIT[0], FN[0])) fail_msg("rank %d: start: %s", RANK, PL->last_error(h.ctx));
    if (create_opt(&h, max_norm)) fail_msg("rank %d: create_optimizer: %s", RANK, PL->last_error(h.ctx));
    /* the oracle: full matrices, REKLS state of its own */
    float *W[NW], *M[NW], *V[NW], *aux[NW], *ws[NW], *G[NW];
    for (int w = 0; w < NW; w++) {
        size_t mn = (size_t)FM[w] * FN[w];
        W[w] = malloc(mn * 4), G[w] = malloc(mn * 4), M[w] = calloc(mn, 4), V[w] = calloc(mn, 4);
        aux[w] = malloc(pt_rekls_aux_words(FM[w], FN[w]) * 4);
        ws[w] = malloc(pt_rekls_ws_words(FM[w], FN[w]) * 4);
        assert_true(W[w] && G[w] && M[w] && V[w] && aux[w] && ws[w]);
        for (int i = 0; i < FM[w]; i++)
            for (int j = 0; j < FN[w]; j++) W[w][(size_t)i * FN[w] + j] = winit(w, i, j);
        pt_rekls_aux_init_host(aux[w], FM[w], FN[w]);
    }
    int same = 1;
    *norm_err = 0;
    char err[512];
    for (int k = 1; k <= STEPS; k++) {
        h.k = k;
        assert_int_equal(PL->pre_step(h.ctx, k, 0, 1), PT_OK);
        if (pass(&h)) fail_msg("rank %d step %d: %s", RANK, k, PL->last_error(h.ctx));
        if (PL->optimizer_step(h.ctx, -1.0f)) fail_msg("rank %d step %d: %s", RANK, k, PL->last_error(h.ctx));
        assert_int_equal(PL->post_step(h.ctx, k, 0.0f), PT_OK);
        /* the oracle's gradients and their norm (double, full matrices) */
        double sq = 0, sq_own = 0;
        for (int w = 0; w < NW; w++)
            for (int i = 0; i < FM[w]; i++)
                for (int j = 0; j < FN[w]; j++) {
                    size_t e = (size_t)i * FN[w] + j;
                    G[w][e] = 0.0f + (gfun(w, k, i, j) + 0.01f * W[w][e]);
                    sq += (double)G[w][e] * G[w][e];
                    int mine = SPLIT[w] == 0 || (SPLIT[w] == 1 ? i / h.lm[w] : j / h.ln[w]) == h.r;
                    if (mine) sq_own += (double)G[w][e] * G[w][e];
                }
        float gs = 1.0f;
        if (max_norm > 0) {
            pt_stats_v1 s = {.struct_size = sizeof s};
            assert_int_equal(PL->get_stats(h.ctx, &s), PT_OK);
            double d = fabs(s.last_grad_norm - sqrt(sq)) / sqrt(sq);
            if (d > *norm_err) *norm_err = d;
            /* control: this rank's shards alone give another norm */
            if (P > 1) assert_true(fabs(s.last_grad_norm - sqrt(sq_own)) / sqrt(sq) > 1e-3);
            if (s.last_grad_norm > max_norm)   /* the plugin's clip factor, from its norm */
                gs = (float)(max_norm / (s.last_grad_norm + 1e-6));
        }
        for (int w = 0; w < NW; w++) {
            pt_rekls_hyper hy = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.01f, oracle_bs, 0, k, gs};
            pt_rekls_tensors x = {FM[w], FN[w], G[w], PT_F32, W[w], NULL, 0, M[w], V[w],
                                  aux[w], ws[w]};
            assert_int_equal(pt_rekls_step(&pt_rekls_la_cpu, &hy, &x, err, sizeof err), 0);
            size_t ln = (size_t)h.lm[w] * h.ln[w];
            float *got = malloc(ln * 4);
            assert_non_null(got);
            assert_int_equal(PL->read_param(h.ctx, w, got, ln * 4), PT_OK);
            for (int i = 0; i < h.lm[w]; i++)
                for (int j = 0; j < h.ln[w]; j++) {
                    float a = got[(size_t)i * h.ln[w] + j];
                    float b = W[w][(size_t)fi(&h, w, i) * FN[w] + fj(&h, w, j)];
                    if (memcmp(&a, &b, 4)) same = 0;
                }
            free(got);
        }
    }
    for (int w = 0; w < NW; w++) {
        free(W[w]); free(G[w]); free(M[w]); free(V[w]); free(aux[w]); free(ws[w]);
    }
    stop(&h);
    return same;
}

static const char *RESIDENT = "[protrain]\nforce_all_persistent = true\n";
static const char *OFFLOAD = "[protrain]\nauto_mode = false\nauto_memory = false\nn_persist = 0\n"
                             "n_buffer = 3\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 16384\n";

static void report(const char *what, int ok) {
    if (RANK == 0)
        printf("  %d rank(s), %s: %s\n", WORLD, what,
               ok ? "every shard bit-identical to single-rank REKLS over 5 steps" : "DIFFERS");
}

static void test_resident(void **s) {
    (void)s;
    double ne;
    int ok = run(RESIDENT, 0, 0.95f, &ne);
    report("resident chunks", ok);
    assert_true(ok);
}

static void test_offloaded(void **s) {
    (void)s;
    double ne;
    int ok = run(OFFLOAD, 0, 0.95f, &ne);
    report("offloaded chunks", ok);
    assert_true(ok);
    /* negative control: another factor decay in the oracle differs */
    assert_false(run(OFFLOAD, 0, 0.9f, &ne));
}

static void test_clipped(void **s) {
    (void)s;
    double ne;
    int ok = run(OFFLOAD, 0.05f, 0.95f, &ne);
    report("offloaded, clipped", ok);
    if (RANK == 0) printf("  global norm vs the full matrices': max relative difference %.2g\n", ne);
    assert_true(ne <= 1e-6);
    assert_true(ok);
}

static void test_refusals(void **s) {
    (void)s;
    host h;
    const char *e;
    /* b0.w 16 x 33 split on rows: 33 columns do not divide by P (only P > 1) */
    if (WORLD > 1 && WORLD <= 4) {
        assert_int_equal(start(&h, WORLD, RESIDENT, 1, 33 / WORLD * WORLD + 1), PT_OK);
        assert_int_not_equal(create_opt(&h, 0), PT_OK);
        e = PL->last_error(h.ctx);
        if (RANK == 0) printf("  refused: %s\n", e);
        assert_non_null(strstr(e, "does not divide"));
        assert_non_null(strstr(e, "b0.w"));
        stop(&h);
    }
    /* a tp_split outside 0..2 */
    assert_int_not_equal(start(&h, WORLD, RESIDENT, 3, FN[0]), PT_OK);
    assert_non_null(strstr(PL->last_error(h.ctx), "tp_split 3"));
    stop(&h);
    /* tp_size that does not divide world_size */
    assert_int_not_equal(start(&h, WORLD + 1, RESIDENT, 1, FN[0]), PT_OK);
    e = PL->last_error(NULL);
    if (RANK == 0) printf("  refused: %s\n", e);
    assert_non_null(strstr(e, "tp_size"));
    stop(&h);
    /* with OSFT */
    assert_int_not_equal(start(&h, 2, "[osft]\nenabled = true\n", 1, FN[0]), PT_OK);
    assert_non_null(strstr(PL->last_error(NULL), "OSFT"));
    stop(&h);
}

int main(void) {
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *rk = getenv("OMPI_COMM_WORLD_RANK");
    if (ws && rk) {
        WORLD = atoi(ws);
        RANK = atoi(rk);
    }
    if (WORLD > 1) {   /* keeps MPI up across the plugin's inits and finalizes */
        pt_coll_config cc = {WORLD, RANK, "env", 60.0, -1, "mpi", 0, NULL};
        char err[512];
        if (pt_coll_open(&cc, &COLL, err, sizeof err)) {
            fprintf(stderr, "test_tp_plugin: %s\n", err);
            return 1;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_offloaded),
        cmocka_unit_test(test_clipped),
        cmocka_unit_test(test_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pt_coll_close(COLL);
    return rc;
}
