/*
 * test_rekls_tp.c — tensor-parallel REKLS against single-rank REKLS.
 *
 * Every rank builds the same full weights and gradients (same seeds), steps
 * the full matrix with plain REKLS (the oracle) and its own shard with
 * tensor-parallel REKLS over the group of all ranks, and after each of 5 steps
 * requires its shard to be bit-identical to the oracle's rows / columns.
 * Shapes (those of the reference's distributed test): 16 x 32 split on rows,
 * 32 x 16 on columns, 96 x 200 on each. A replicated weight steps with plain
 * REKLS (no collective), so it has no case here.
 * Run plainly by make test (one rank: the gathers are copies, and the recomputed
 * eigendecomposition must equal the stored one bit for bit), and by
 * tests/dist.sh under mpirun -np 2 and -np 4. Also: full shapes that do not
 * divide by the group size are refused with a sentence (any group size, checked
 * here for 1..8); a negative control (a different shampoo beta on the oracle)
 * shows the comparison can fail. Each weight-decay mode, rows and columns,
 * equals single-rank REKLS in that mode.
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

#include "coll/coll.h"
#include "optim/optim.h"
#include "protrain.h"

static pt_coll *COLL;
static int WORLD = 1, RANK = 0;

static uint64_t rs;
static float frand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rs >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* local copy gather for one rank (no coll needed) */
static int gather_self(void *ctx, void *buf, size_t n, size_t es, const char *what, char *err,
                       size_t errlen) {
    (void)ctx, (void)buf, (void)n, (void)es, (void)what, (void)err, (void)errlen;
    return 0;
}

/* Returns 1 when every step's shard matched the oracle bit for bit. Decay wd
 * in mode wdm for the sharded step, oracle_wdm for the oracle. */
static int run_case_wd(int m, int n, int split, float oracle_bs, float wd, int wdm,
                       int oracle_wdm) {
    size_t mn = (size_t)m * n;
    int P = WORLD, r = RANK, ml = split == 1 ? m / P : m, nl = split == 2 ? n / P : n;
    float *W = malloc(mn * 4), *g = malloc(mn * 4), *M = calloc(mn, 4), *V = calloc(mn, 4);
    float *aux = malloc(pt_rekls_aux_words(m, n) * 4), *ws = malloc(pt_rekls_ws_words(m, n) * 4);
    float *Wl = malloc((size_t)ml * nl * 4), *gl = malloc((size_t)ml * nl * 4);
    float *Mt = calloc(mn, 4), *Vt = calloc(mn, 4);
    float *Ll = calloc((size_t)(m / P) * m, 4), *Rl = calloc((size_t)(n / P) * n, 4);
    float *wst = malloc(pt_rekls_tp_ws_words(m, n) * 4);
    assert_true(W && g && M && V && aux && ws && Wl && gl && Mt && Vt && Ll && Rl && wst);
    rs = 0x1234u + (uint64_t)m * 7 + (uint64_t)n;
    for (size_t i = 0; i < mn; i++) W[i] = 0.1f * frand();
    pt_rekls_aux_init_host(aux, m, n);
    for (int i = 0; i < ml; i++)
        for (int j = 0; j < nl; j++)
            Wl[(size_t)i * nl + j] = W[(size_t)(split == 1 ? r * ml + i : i) * n + (split == 2 ? r * nl + j : j)];
    pt_rekls_tp tp = {P, r, split, P > 1 ? pt_rekls_tp_gather_coll : gather_self, COLL};
    int same = 1;
    char err[512];
    for (int k = 1; k <= 5; k++) {
        for (size_t i = 0; i < mn; i++) g[i] = frand();
        pt_rekls_hyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, wd, 0.95f, 0, k, 1.0f, wdm};
        pt_rekls_hyper ho = h;
        ho.shampoo_beta = oracle_bs;
        ho.wd_mode = oracle_wdm;
        pt_rekls_tensors x = {m, n, g, PT_F32, W, NULL, 0, M, V, aux, ws};
        assert_int_equal(pt_rekls_step(&pt_rekls_la_cpu, &ho, &x, err, sizeof err), 0);
        for (int i = 0; i < ml; i++)
            for (int j = 0; j < nl; j++)
                gl[(size_t)i * nl + j] = g[(size_t)(split == 1 ? r * ml + i : i) * n + (split == 2 ? r * nl + j : j)];
        pt_rekls_tp_tensors xt = {m, n, gl, PT_F32, Wl, NULL, 0, Mt, Vt, Ll, Rl, wst};
        int rc = pt_rekls_tp_step(&pt_rekls_la_cpu, &h, &tp, &xt, err, sizeof err);
        if (rc) fail_msg("rank %d: %s", r, err);
        for (int i = 0; i < ml; i++)
            for (int j = 0; j < nl; j++) {
                float a = Wl[(size_t)i * nl + j];
                float b = W[(size_t)(split == 1 ? r * ml + i : i) * n + (split == 2 ? r * nl + j : j)];
                if (memcmp(&a, &b, 4)) same = 0;
            }
        if (memcmp(Mt, M, mn * 4) || memcmp(Vt, V, mn * 4)) same = 0;
        pt_rekls_view v = pt_rekls_aux_view(aux, m, n);
        if (memcmp(Ll, v.L + (size_t)r * (m / P) * m, (size_t)(m / P) * m * 4) ||
            memcmp(Rl, v.R + (size_t)r * (n / P) * n, (size_t)(n / P) * n * 4))
            same = 0;
    }
    free(W);
    free(g);
    free(M);
    free(V);
    free(aux);
    free(ws);
    free(Wl);
    free(gl);
    free(Mt);
    free(Vt);
    free(Ll);
    free(Rl);
    free(wst);
    return same;
}
static int run_case(int m, int n, int split, float oracle_bs) {
    return run_case_wd(m, n, split, oracle_bs, 0.01f, PT_REKLS_WD_DECOUPLED,
                       PT_REKLS_WD_DECOUPLED);
}

static void test_equals_single_rank(void **state) {
    (void)state;
    static const int cases[][3] = {{16, 32, 1}, {32, 16, 2}, {96, 200, 1}, {96, 200, 2}};
    for (int c = 0; c < 4; c++) {
        int ok = run_case(cases[c][0], cases[c][1], cases[c][2], 0.95f);
        if (RANK == 0)
            printf("  %d rank(s): %3d x %3d %s: %s\n", WORLD, cases[c][0], cases[c][1],
                   cases[c][2] == 1 ? "split on rows" : "split on columns",
                   ok ? "bit-identical to single-rank REKLS over 5 steps" : "DIFFERS");
        assert_true(ok);
    }
    /* negative control: the oracle with another factor decay differs */
    assert_false(run_case(16, 32, 1, 0.9f));
}

/* Every weight-decay mode (wd 0.2, large enough to matter), rows and columns:
 * the shards equal single-rank REKLS in the same mode bit for bit. l2 gathers
 * the full weights and adds wd W where REKLS does (after the factor update);
 * control: the shards in l2 mode differ from the oracle in decoupled mode, and
 * those in palm mode from the oracle in independent mode. */
static void test_decay_modes(void **state) {
    (void)state;
    static const char *const name[4] = {"decoupled", "independent", "l2", "palm"};
    for (int md = 0; md < 4; md++)
        for (int split = 1; split <= 2; split++) {
            int m = split == 1 ? 16 : 32, n = split == 1 ? 32 : 16;
            int ok = run_case_wd(m, n, split, 0.95f, 0.2f, md, md);
            if (RANK == 0)
                printf("  %d rank(s): %2d x %2d %s, weight decay %s: %s\n", WORLD, m, n,
                       split == 1 ? "rows" : "columns", name[md],
                       ok ? "bit-identical to single-rank REKLS over 5 steps" : "DIFFERS");
            assert_true(ok);
        }
    assert_false(run_case_wd(32, 16, 2, 0.95f, 0.2f, PT_REKLS_WD_L2, PT_REKLS_WD_DECOUPLED));
    assert_false(run_case_wd(16, 32, 1, 0.95f, 0.2f, PT_REKLS_WD_PALM, PT_REKLS_WD_INDEPENDENT));
}

static void test_refuses_non_divisible(void **state) {
    (void)state;
    char err[512];
    for (int P = 1; P <= 8; P++)
        for (int split = 1; split <= 2; split++) {
            int m = 24, n = 40;   /* 24 divides by 1,2,3,4,6,8; 40 by 1,2,4,5,8 */
            int want = (m % P || n % P) ? PT_ERR_INVALID_ARG : PT_OK;
            assert_int_equal(pt_rekls_tp_check(m, n, P, split, err, sizeof err), want);
            if (want) assert_non_null(strstr(err, "does not divide"));
        }
    assert_int_equal(pt_rekls_tp_check(18, 32, 4, 1, err, sizeof err), PT_ERR_INVALID_ARG);
    if (RANK == 0) printf("  refused: %s\n", err);
    /* a replicated weight needs no divisibility */
    assert_int_equal(pt_rekls_tp_check(18, 33, 4, 0, err, sizeof err), PT_OK);
}

int main(void) {
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *rk = getenv("OMPI_COMM_WORLD_RANK");
    if (ws && rk) {
        WORLD = atoi(ws);
        RANK = atoi(rk);
    }
    if (WORLD > 1) {
        pt_coll_config cc = {WORLD, RANK, "env", 60.0, -1, "mpi", 0, NULL, NULL};
        char err[512];
        if (pt_coll_open(&cc, &COLL, err, sizeof err)) {
            fprintf(stderr, "test_rekls_tp: %s\n", err);
            return 1;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_single_rank),
        cmocka_unit_test(test_decay_modes),
        cmocka_unit_test(test_refuses_non_divisible),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pt_coll_close(COLL);
    return rc;
}
