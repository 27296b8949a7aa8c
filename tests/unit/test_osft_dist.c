/*
 * test_osft_dist.c — OSFT's projection when V is sharded across ranks, in
 * double, on P = 2 row shards (torch.chunk semantics: equal ceil(rows / P)
 * blocks, the short one last), with k = 5, kl = 3 and M = 11 so nothing divides
 * by 2:
 *  - all-gathering V_high and projecting each rank's own dV rows is exact;
 *  - sharding the contracted dimension (the columns M) makes the per-rank
 *    coefficient products true partial sums: one all-reduce, then a local update,
 *    is exact too;
 *  - the local-coefficient all-reduce (each rank multiplies its dV rows by its
 *    own V_high rows and the blocks are summed as if they were partial sums, a
 *    mistake proposed for mini_trainer's sharded OSFT in a pull request that was
 *    not merged; no released mini_trainer has it) fails the equivalence;
 *  - the projection is linear: projecting each rank's gradient and summing equals
 *    projecting the sum, which is why the plugin projects before any reduction.
 */
#include <lapacke.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

/* torch.chunk rows of shard r of P over n rows: [lo, hi) */
static void chunk_rows(int64_t n, int p, int r, int64_t *lo, int64_t *hi) {
    int64_t c = (n + p - 1) / p;
    *lo = r * c < n ? r * c : n;
    *hi = (r + 1) * c < n ? (r + 1) * c : n;
}

static void test_distributed_v_projection(void **s) {
    (void)s;
    enum { M = 11, K = 5, KL = 3, NP = 2 };   /* k, kl, M not divisible by 2 */
    double a[K * M], sv[K], vt[K * M], u[K * K];
    for (int i = 0; i < K * M; i++) a[i] = sin(0.7 * i + 0.3) + 0.1 * cos(1.3 * i);
    /* orthonormal rows of V_high from an SVD */
    assert_int_equal(LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', K, M, a, M, sv, u, K, vt, M), 0);
    double dv[KL * M], exact[KL * M];
    for (int i = 0; i < KL * M; i++) dv[i] = cos(0.41 * i) - 0.2;
    /* exact: dV -= (dV Vh^T) Vh */
    memcpy(exact, dv, sizeof dv);
    for (int j = 0; j < KL; j++)
        for (int i = 0; i < K; i++) {
            double c = 0;
            for (int m = 0; m < M; m++) c += dv[j * M + m] * vt[i * M + m];
            for (int m = 0; m < M; m++) exact[j * M + m] -= c * vt[i * M + m];
        }
    /* rank r holds dV rows lrows_r and Vh rows krows_r (the default row sharding) */
    double gather[KL * M], local[KL * M], colsh[KL * M];
    memcpy(gather, dv, sizeof dv);
    memcpy(local, dv, sizeof dv);
    memcpy(colsh, dv, sizeof dv);
    /* (1) all-gather Vh, local GEMMs on the own dV rows */
    for (int r = 0; r < NP; r++) {
        int64_t l0, l1;
        chunk_rows(KL, NP, r, &l0, &l1);
        for (int64_t j = l0; j < l1; j++)
            for (int i = 0; i < K; i++) {
                double c = 0;
                for (int m = 0; m < M; m++) c += dv[j * M + m] * vt[i * M + m];
                for (int m = 0; m < M; m++) gather[j * M + m] -= c * vt[i * M + m];
            }
    }
    /* (2) the local-coefficient all-reduce: each rank multiplies its dV rows by
     * its own Vh rows, the blocks are summed over ranks as if they were partial
     * sums, and each rank removes them along its own Vh rows */
    {
        double sum[KL * K];
        memset(sum, 0, sizeof sum);
        for (int r = 0; r < NP; r++) {
            int64_t l0, l1, k0, k1;
            chunk_rows(KL, NP, r, &l0, &l1);
            chunk_rows(K, NP, r, &k0, &k1);
            for (int64_t j = l0; j < l1; j++)
                for (int64_t i = k0; i < k1; i++) {
                    double c = 0;
                    for (int m = 0; m < M; m++) c += dv[j * M + m] * vt[i * M + m];
                    /* packed as the rank's local (rows x local-k) block */
                    sum[(j - l0) * K + (i - k0)] += c;
                }
        }
        for (int r = 0; r < NP; r++) {
            int64_t l0, l1, k0, k1;
            chunk_rows(KL, NP, r, &l0, &l1);
            chunk_rows(K, NP, r, &k0, &k1);
            for (int64_t j = l0; j < l1; j++)
                for (int64_t i = k0; i < k1; i++)
                    for (int m = 0; m < M; m++)
                        local[j * M + m] -= sum[(j - l0) * K + (i - k0)] * vt[i * M + m];
        }
    }
    /* (3) columns (the contracted M) sharded: partial products are true partial
     * sums, one all-reduce, local update */
    {
        double kc[KL * K];
        memset(kc, 0, sizeof kc);
        for (int r = 0; r < NP; r++) {
            int64_t c0, c1;
            chunk_rows(M, NP, r, &c0, &c1);
            for (int j = 0; j < KL; j++)
                for (int i = 0; i < K; i++)
                    for (int64_t m = c0; m < c1; m++) kc[j * K + i] += dv[j * M + m] * vt[i * M + m];
        }
        for (int j = 0; j < KL; j++)
            for (int i = 0; i < K; i++)
                for (int m = 0; m < M; m++) colsh[j * M + m] -= kc[j * K + i] * vt[i * M + m];
    }
    double eg = 0, el = 0, ec = 0;
    for (int i = 0; i < KL * M; i++) {
        eg = fmax(eg, fabs(gather[i] - exact[i]));
        el = fmax(el, fabs(local[i] - exact[i]));
        ec = fmax(ec, fabs(colsh[i] - exact[i]));
    }
    printf("  V projection on 2 shards (k 5, kl 3, M 11): all-gather %.2g, column-sharded "
           "all-reduce %.2g, local-coefficient all-reduce %.2g (max abs error)\n", eg, ec, el);
    assert_true(eg <= 1e-12 && ec <= 1e-12);
    assert_true(el > 1e-3);   /* the local-coefficient mistake fails the equivalence */
    /* linear: project(g_rank0) + project(g_rank1) = project(g_rank0 + g_rank1) */
    double g1[KL * M], p0[KL * M], p1[KL * M], ps[KL * M];
    for (int i = 0; i < KL * M; i++) g1[i] = sin(0.23 * i) + 0.5;
    for (int w = 0; w < 3; w++) {
        double *src = w == 0 ? dv : w == 1 ? g1 : NULL, *dst = w == 0 ? p0 : w == 1 ? p1 : ps;
        for (int i = 0; i < KL * M; i++) dst[i] = src ? src[i] : dv[i] + g1[i];
        for (int j = 0; j < KL; j++)
            for (int i = 0; i < K; i++) {
                double c = 0;
                for (int m = 0; m < M; m++) c += dst[j * M + m] * vt[i * M + m];
                for (int m = 0; m < M; m++) dst[j * M + m] -= c * vt[i * M + m];
            }
    }
    double elin = 0;
    for (int i = 0; i < KL * M; i++) elin = fmax(elin, fabs(p0[i] + p1[i] - ps[i]));
    assert_true(elin <= 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distributed_v_projection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
