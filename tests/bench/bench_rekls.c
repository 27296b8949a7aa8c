/*
 * bench_rekls.c — one REKLS step per shape on the CPU path (what offloaded
 * chunks run), split into eigendecompositions, GEMMs and element kernels
 * (the Adam in the eigenbasis and the factor averages), against a prediction
 * from FLOP counts at rates measured here (make bench).
 *
 * Prediction: the profiler's own model (pt_rekls_measure_rates /
 * pt_rekls_predict_s): per call a fixed cost plus FLOPs at a rate, fitted from
 * GEMMs and eigendecompositions at 64 and 384 (best of 3 each, this process);
 * 14 GEMM calls, 2 eigh calls per step, eigh FLOPs counted as 9 d^3 per side.
 * Element kernels are not predicted (memory-bound, a few % of the step).
 * Shapes: 64, 128, 256, 512, 1024 square and 768 x 3072 (an MLP weight of
 * GPT-2 small), then the four block weights of sample_host's default model
 * (C = 192: 576x192, 192x192, 768x192, 192x768) summed over its 6 blocks.
 * Env: PT_BENCH_STRICT=1: exit 1 when a shape is measured outside [0.5, 2] x
 * its prediction (the cost model would then be off by more than 2x).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "la_cpu.h"
#include "optim/optim.h"
#include "protrain.h"
#include "pt_util.h"

static double t_gemm, t_eigh, t_ew;
static int w_gemm(void *c, int ta, int tb, int M, int N, int K, float al, const float *A, int lda,
                  const float *B, int ldb, float be, float *C, int ldc) {
    double t0 = pt_now_s();
    int rc = pt_rekls_la_cpu.gemm(c, ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc);
    t_gemm += pt_now_s() - t0;
    return rc;
}
static int w_eigh(void *c, int n, float *A, float *w) {
    double t0 = pt_now_s();
    int rc = pt_rekls_la_cpu.eigh(c, n, A, w);
    t_eigh += pt_now_s() - t0;
    return rc;
}
static int w_ew(void *c, const pt_rekls_ew_args *a) {
    double t0 = pt_now_s();
    int rc = pt_rekls_la_cpu.ew(c, a);
    t_ew += pt_now_s() - t0;
    return rc;
}
static int w_copy(void *c, float *d, const float *s, size_t n) {
    double t0 = pt_now_s();
    int rc = pt_rekls_la_cpu.copy(c, d, s, n);
    t_ew += pt_now_s() - t0;
    return rc;
}
static const pt_rekls_la TIMED = {NULL, w_gemm, w_eigh, w_ew, w_copy};

static uint64_t rs = 12345;
static float frand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rs >> 11) * 0x1.0p-53 - 0.5);
}

typedef struct {
    double gemm, eigh, ew, total;
} split;

/* steps of an m x n parameter; the split of the last one */
static split run_shape(int m, int n, int steps) {
    size_t mn = (size_t)m * n;
    float *W = malloc(mn * 4), *g = malloc(mn * 4), *M = calloc(mn, 4), *V = calloc(mn, 4);
    float *aux = malloc(pt_rekls_aux_words(m, n) * 4), *ws = malloc(pt_rekls_ws_words(m, n) * 4);
    for (size_t i = 0; i < mn; i++) W[i] = frand();
    pt_rekls_aux_init_host(aux, m, n);
    split s = {0, 0, 0, 0};
    for (int k = 1; k <= steps; k++) {
        for (size_t i = 0; i < mn; i++) g[i] = frand();
        pt_rekls_hyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.01f, 0.95f, 0, k, 1.0f, PT_REKLS_WD_DECOUPLED};
        pt_rekls_tensors x = {m, n, g, PT_F32, W, NULL, 0, M, V, aux, ws};
        char err[256];
        t_gemm = t_eigh = t_ew = 0;
        double t0 = pt_now_s();
        if (pt_rekls_step(&TIMED, &h, &x, err, sizeof err)) {
            fprintf(stderr, "bench_rekls: %s\n", err);
            exit(1);
        }
        s.total = pt_now_s() - t0;
        s.gemm = t_gemm;
        s.eigh = t_eigh;
        s.ew = t_ew;
    }
    free(W);
    free(g);
    free(M);
    free(V);
    free(aux);
    free(ws);
    return s;
}

int main(void) {
    const char *sv = getenv("PT_BENCH_STRICT");
    int strict = sv && *sv && strcmp(sv, "0") != 0;
    pt_rekls_rates R;
    pt_rekls_measure_rates(&R);
    printf("REKLS step on the CPU path (one thread of the optimizer; OpenBLAS + LAPACKE)\n");
    printf("model: sgemm %.1f us/call + %.1f GFLOP/s, eigh %.1f us/call + %.1f GFLOP/s-equivalent "
           "(9 d^3), fitted at 64 and 384\n",
           R.gemm_call_s * 1e6, R.gemm_flops_per_s / 1e9,
           R.eigh_call_s * 1e6, R.eigh_flops_per_s / 1e9);
    printf("%11s | %9s %9s %9s %9s | %9s %9s %9s | %6s\n", "shape", "eigh s", "gemm s", "elem s",
           "total s", "pred eigh", "pred gemm", "pred tot", "meas/pred");
    static const int shapes[][2] = {{64, 64}, {128, 128}, {256, 256}, {512, 512}, {1024, 1024}, {768, 3072}};
    int bad = 0;
    for (int i = 0; i < 6; i++) {
        int m = shapes[i][0], n = shapes[i][1];
        split s = run_shape(m, n, m * n >= 1 << 20 ? 1 : 3);
        double pe = pt_rekls_predict_s(&R, 1, 0, pt_rekls_eigh_flops(m, n)) -
                    PT_REKLS_GEMM_CALLS * R.gemm_call_s,
               pg = pt_rekls_predict_s(&R, 1, pt_rekls_gemm_flops(m, n), 0) -
                    PT_REKLS_EIGH_CALLS * R.eigh_call_s;
        double r = s.total / (pe + pg);
        printf("%5d x %4d | %9.4f %9.4f %9.4f %9.4f | %9.4f %9.4f %9.4f | %6.2f\n", m, n, s.eigh,
               s.gemm, s.ew, s.total, pe, pg, pe + pg, r);
        if (r < 0.5 || r > 2.0) bad = 1;
    }
    /* sample_host's default model: C = 192, 6 blocks */
    static const int blk[4][2] = {{576, 192}, {192, 192}, {768, 192}, {192, 768}};
    double tot = 0, pred = 0;
    for (int i = 0; i < 4; i++) {
        split s = run_shape(blk[i][0], blk[i][1], 3);
        tot += 6 * s.total;
        pred += 6 * pt_rekls_predict_s(&R, 1, pt_rekls_gemm_flops(blk[i][0], blk[i][1]),
                                       pt_rekls_eigh_flops(blk[i][0], blk[i][1]));
    }
    printf("sample_host default model (6 blocks, C = 192): REKLS work %.3f s per step on one "
           "thread (predicted %.3f s); compare with its step time in make run\n",
           tot, pred);
    if (bad && strict) {
        printf("STRICT: a shape was measured outside [0.5, 2] x its prediction\n");
        return 1;
    }
    return 0;
}
